# Tests of the unimem command, of the installed package and of the guide's
# examples. Included from tests/extra.cmake.

set(_um_pkg ${CMAKE_CURRENT_SOURCE_DIR}/packaging)
set(_um_san_flags "")
if(UNIMEM_SANITIZE STREQUAL "address")
  set(_um_san_flags "-fsanitize=address,undefined")
elseif(UNIMEM_SANITIZE STREQUAL "thread")
  set(_um_san_flags "-fsanitize=thread")
endif()

find_program(UM_PYTHON3 python3)

if(TARGET unimem_tool)
  set(_um_tool $<TARGET_FILE:unimem_tool>)
  set(_um_check ${_um_pkg}/check_tool.sh)
  add_test(NAME tool_info COMMAND ${_um_check} 0 "device\\(s\\)" "\\[0\\] cpu" "peer access" -- ${_um_tool} info)
  add_test(NAME tool_stats COMMAND ${_um_check} 0
           "^pool_hits +[0-9]+" "^hit_rate +0\\.[0-9]+" "^bytes_h2d +[1-9]" "device 0: " -- ${_um_tool} stats)
  add_test(NAME tool_stats_json COMMAND ${_um_check} 0
           "^\\{\"devices\":\\[\\{\"index\":0,\"backend\":\"cpu\"" "\"all\":\\{\"active_buffers\":2,"
           -- ${_um_tool} stats --device 0 --json -)
  find_program(UM_GNUPLOT gnuplot)
  set(_um_bench_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_stream)
  set(_um_bench_expect "speedup" "checksum matched" "summary: stream ok" "full report: ")
  if(UM_GNUPLOT)
    list(APPEND _um_bench_expect "chart: ")
  endif()
  add_test(NAME tool_bench_stream_quick COMMAND ${_um_check} 0 ${_um_bench_expect}
           -- ${_um_tool} bench stream --quick --json ${_um_bench_out}/bench.json --plot ${_um_bench_out}/bench.svg)
  set_tests_properties(tool_bench_stream_quick PROPERTIES FIXTURES_SETUP tool_stream_json)

  # unimem bench pool replays the trace it finds beside itself: here the
  # build tree's copy (run from another directory, UNIMEM_TRACE_DIR unset);
  # and the one in the directory UNIMEM_TRACE_DIR names.
  set(_um_pool_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_pool)
  set(_um_trace_dir ${CMAKE_CURRENT_BINARY_DIR}/tool_traces)
  file(MAKE_DIRECTORY ${_um_pool_out})
  file(WRITE ${_um_trace_dir}/mixed.txt "# two allocations, both freed\na 0 4096\na 1 1048576\nf 0\nf 1\n")
  string(REPLACE "." "\\." _um_build_re "${CMAKE_BINARY_DIR}")
  string(REPLACE "." "\\." _um_trace_re "${_um_trace_dir}")
  add_test(NAME tool_bench_pool_quick
           COMMAND ${_um_check} 0 "^Trace replay: ${_um_build_re}/bench/traces/mixed\\.txt$"
                   "^  4000 allocations, 8000 events;" "^  mixed, calls only " "summary: pool ok" "full report: "
                   -- env -u UNIMEM_TRACE_DIR ${_um_tool} bench pool --quick --json ${_um_pool_out}/bench.json
           WORKING_DIRECTORY ${_um_pool_out})
  set_tests_properties(tool_bench_pool_quick PROPERTIES FIXTURES_SETUP tool_pool_json)
  add_test(NAME tool_bench_pool_trace_dir
           COMMAND ${_um_check} 0 "^Trace replay: ${_um_trace_re}/mixed\\.txt$"
                   "^  2 allocations, 4 events; peak requested 1\\.0 MiB$" "summary: pool ok"
                   -- ${_um_tool} bench pool --quick)
  set_tests_properties(tool_bench_pool_trace_dir PROPERTIES ENVIRONMENT "UNIMEM_TRACE_DIR=${_um_trace_dir}")
  set(_um_tool_tests tool_bench_pool_quick tool_bench_pool_trace_dir)

  # The merged reports are strict JSON with the keys their readers use.
  if(UM_PYTHON3)
    add_test(NAME tool_bench_stream_json
             COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_bench_out}/bench.json stream ok
                     stream:unimem_ns stream:naive_ns stream:speedup stream:chunk_bytes)
    set_tests_properties(tool_bench_stream_json PROPERTIES FIXTURES_REQUIRED tool_stream_json)
    add_test(NAME tool_bench_pool_json
             COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_pool_out}/bench.json pool ok
                     hit:unimem_ns hit:glibc_ns touch:speedup_vs_glibc seeds:speedup threads:scaling
                     trace:hit_rate trace:peak_reserved_capped_bytes)
    set_tests_properties(tool_bench_pool_json PROPERTIES FIXTURES_REQUIRED tool_pool_json)
    list(APPEND _um_tool_tests tool_bench_stream_json tool_bench_pool_json)
  endif()

  add_test(NAME tool_help COMMAND ${_um_check} 0 "^NAME" "^SYNOPSIS" "^OPTIONS" "^ENVIRONMENT" "^EXIT STATUS"
           -- ${_um_tool} bench --help)
  add_test(NAME tool_bad_usage COMMAND ${_um_check} 2 "unknown benchmark 'nosuch'" -- ${_um_tool} bench nosuch)
  set_tests_properties(tool_info tool_stats tool_stats_json tool_bench_stream_quick tool_help tool_bad_usage
                       ${_um_tool_tests} PROPERTIES LABELS "tool" TIMEOUT 300)
endif()

add_test(NAME package_symbols COMMAND ${_um_pkg}/test_symbols.sh $<TARGET_FILE:unimem> ${PROJECT_VERSION_MAJOR})
add_test(NAME package_install COMMAND ${_um_pkg}/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
                                      ${CMAKE_C_COMPILER} "${_um_san_flags}")
set_tests_properties(package_symbols package_install PROPERTIES LABELS "packaging" TIMEOUT 300
                     SKIP_RETURN_CODE 77)

# Every C example of docs/guide.md compiles (-Wall -Wextra -Werror) and runs.
if(UM_PYTHON3)
  add_test(NAME guide_examples
           COMMAND ${UM_PYTHON3} ${_um_pkg}/check_guide.py ${CMAKE_SOURCE_DIR}/docs/guide.md ${CMAKE_C_COMPILER}
                   ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_SOURCE_DIR}/include $<TARGET_FILE:unimem_static>
                   ${_um_san_flags})
  set_tests_properties(guide_examples PROPERTIES LABELS "docs" TIMEOUT 300)
endif()
