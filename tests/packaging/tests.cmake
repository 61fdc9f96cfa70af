# Tests of the unimem command, of the installed package and of the guide's
# examples. Included from tests/extra.cmake.

set(_um_pkg ${CMAKE_CURRENT_SOURCE_DIR}/packaging)
set(_um_san_flags "")
if(UNIMEM_SANITIZE STREQUAL "address")
  set(_um_san_flags "-fsanitize=address,undefined")
elseif(UNIMEM_SANITIZE STREQUAL "thread")
  set(_um_san_flags "-fsanitize=thread")
endif()

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
  add_test(NAME tool_help COMMAND ${_um_check} 0 "^NAME" "^SYNOPSIS" "^OPTIONS" "^ENVIRONMENT" "^EXIT STATUS"
           -- ${_um_tool} bench --help)
  add_test(NAME tool_bad_usage COMMAND ${_um_check} 2 "unknown benchmark 'nosuch'" -- ${_um_tool} bench nosuch)
  set_tests_properties(tool_info tool_stats tool_stats_json tool_bench_stream_quick tool_help tool_bad_usage
                       PROPERTIES LABELS "tool" TIMEOUT 300)
endif()

add_test(NAME package_symbols COMMAND ${_um_pkg}/test_symbols.sh $<TARGET_FILE:unimem> ${PROJECT_VERSION_MAJOR})
add_test(NAME package_install COMMAND ${_um_pkg}/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
                                      ${CMAKE_C_COMPILER} "${_um_san_flags}")
set_tests_properties(package_symbols package_install PROPERTIES LABELS "packaging" TIMEOUT 300
                     SKIP_RETURN_CODE 77)

# Every C example of docs/guide.md compiles (-Wall -Wextra -Werror) and runs.
find_program(UM_PYTHON3 python3)
if(UM_PYTHON3)
  add_test(NAME guide_examples
           COMMAND ${UM_PYTHON3} ${_um_pkg}/check_guide.py ${CMAKE_SOURCE_DIR}/docs/guide.md ${CMAKE_C_COMPILER}
                   ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_SOURCE_DIR}/include $<TARGET_FILE:unimem_static>
                   ${_um_san_flags})
  set_tests_properties(guide_examples PROPERTIES LABELS "docs" TIMEOUT 300)
endif()
