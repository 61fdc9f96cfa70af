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
  # --verbose: each device's native handles; the cpu has none.
  add_test(NAME tool_info_verbose COMMAND ${_um_check} 0 "^unimem [0-9.]+: 1 device\\(s\\)$"
           "^    native: +cpu \\(no native handles\\)$" -- ${_um_tool} info --verbose)
  set_tests_properties(tool_info_verbose PROPERTIES ENVIRONMENT "UNIMEM_BACKENDS=cpu")
  add_test(NAME tool_info_bad_option COMMAND ${_um_check} 2 "unknown option '--nosuch'" -- ${_um_tool} info --nosuch)
  add_test(NAME tool_info_help COMMAND ${_um_check} 0 "^SYNOPSIS" "unimem info \\[--verbose\\]" "-v, --verbose"
           -- ${_um_tool} info --help)
  set(_um_tool_tests tool_info_verbose tool_info_bad_option tool_info_help)
  if(UM_HAVE_OPENCL)
    # Two PoCL devices of one platform: the four OpenCL handles of each (the
    # context is the same for both); skipped where no OpenCL device is found.
    set(_um_ptr "0x[0-9a-f]+")
    add_test(NAME tool_info_verbose_opencl COMMAND ${_um_check} 0 "^\\[1\\] opencl "
             "^    native: +opencl platform=${_um_ptr} device=${_um_ptr} context=${_um_ptr} queue=${_um_ptr}$"
             "^\\[2\\] opencl " -- ${_um_tool} info -v)
    set_tests_properties(tool_info_verbose_opencl PROPERTIES SKIP_REGULAR_EXPRESSION ": 1 device\\(s\\)"
                         ENVIRONMENT "UNIMEM_BACKENDS=cpu,opencl;POCL_DEVICES=pthread pthread")
    list(APPEND _um_tool_tests tool_info_verbose_opencl)
  endif()
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
  list(APPEND _um_tool_tests tool_bench_pool_quick tool_bench_pool_trace_dir)

  # UNIMEM_TRACE_FILE records a program's allocations; the recording of the
  # pool's own replay of mixed.txt replays to mixed.txt's figures. The
  # replay opens a manager per pass: the third (".3", the first from an
  # empty pool) holds one whole replay (the peak-RSS children record
  # nothing).
  set(_um_rec_out ${CMAKE_CURRENT_BINARY_DIR}/tool_trace_record)
  file(MAKE_DIRECTORY ${_um_rec_out})
  add_test(NAME tool_trace_record
           COMMAND ${_um_check} 0 "summary: pool ok"
                   -- ${_um_tool} bench pool --quick --only trace --trace ${CMAKE_BINARY_DIR}/bench/traces/mixed.txt)
  set_tests_properties(tool_trace_record PROPERTIES FIXTURES_SETUP tool_trace_rec
                       ENVIRONMENT "UNIMEM_TRACE_FILE=${_um_rec_out}/rec.txt")
  add_test(NAME tool_trace_replay
           COMMAND ${_um_check} 0 "^  4000 allocations, 8000 events; peak requested 93\\.1 MiB$"
                   "^  from an empty pool: hit rate 100\\.0%, peak reserved .* = 1\\.[01][0-9]x peak requested$"
                   "summary: pool ok"
                   -- ${_um_tool} bench pool --quick --only trace --trace ${_um_rec_out}/rec.txt.3)
  set_tests_properties(tool_trace_replay PROPERTIES FIXTURES_REQUIRED tool_trace_rec)
  list(APPEND _um_tool_tests tool_trace_record tool_trace_replay)

  # unimem replay FILE: a trace of two blocks, its exact figures (the first
  # allocation makes the segment, the second is carved from it), its JSON
  # and, with gnuplot, its chart; no file (usage, 2) and a missing one (1).
  set(_um_replay_out ${CMAKE_CURRENT_BINARY_DIR}/tool_replay)
  file(MAKE_DIRECTORY ${_um_replay_out})
  file(WRITE ${_um_replay_out}/two.txt "# two allocations, both freed\na 0 4096\na 1 1048576\nf 0\nf 1\n")
  string(REPLACE "." "\\." _um_replay_re "${_um_replay_out}")
  set(_um_replay_args --quick --json ${_um_replay_out}/two.json)
  set(_um_replay_expect "^Trace replay: ${_um_replay_re}/two\\.txt$"
      "^  2 allocations, 4 events; peak requested 1\\.0 MiB$"
      "^  from an empty pool: hit rate 50\\.0%, peak reserved \\(live \\+ idle\\) 1\\.1 MiB = 1\\.06x peak requested$"
      "^  two, touched " "^  two, calls only ")
  if(NOT UNIMEM_SANITIZE) # a sanitizer build leaves the peak-RSS children out (bench_pool.c)
    list(APPEND _um_replay_expect
         "^  peak RSS growth, every page touched \\(a process each\\), over peak requested: unimem [0-9.]+x glibc")
  endif()
  if(UM_GNUPLOT)
    list(APPEND _um_replay_args --plot ${_um_replay_out}/two.svg)
    list(APPEND _um_replay_expect "^chart: ${_um_replay_re}/two\\.svg$")
  endif()
  add_test(NAME tool_replay COMMAND ${_um_check} 0 ${_um_replay_expect}
           -- ${_um_tool} replay ${_um_replay_out}/two.txt ${_um_replay_args})
  add_test(NAME tool_replay_usage COMMAND ${_um_check} 2 "^usage: unimem replay FILE" -- ${_um_tool} replay)
  add_test(NAME tool_replay_missing COMMAND ${_um_check} 1 "^unimem replay: cannot read /nonexistent/trace\\.txt"
           -- ${_um_tool} replay /nonexistent/trace.txt)
  add_test(NAME tool_replay_help COMMAND ${_um_check} 0 "^SYNOPSIS" "unimem replay FILE" -- ${_um_tool} replay --help)
  list(APPEND _um_tool_tests tool_replay tool_replay_usage tool_replay_missing tool_replay_help)

  # The kernel chains against raw OpenCL events: both sides' results are
  # checked before timing; skipped where no OpenCL device is found.
  set(_um_kernels_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_kernels)
  add_test(NAME tool_bench_kernels_quick
           COMMAND ${_um_check} 0 "^chain +unimem +raw events +ratio +added +spread"
                   "^local 4 KiB +[0-9.]+ us +[0-9.]+ us " "^  <= 1 us added per step, local 4 KiB: [-+][0-9.]+ us"
                   "summary: kernels ok" "full report: "
                   -- ${_um_tool} bench kernels --quick --json ${_um_kernels_out}/bench.json)
  set_tests_properties(tool_bench_kernels_quick PROPERTIES FIXTURES_SETUP tool_kernels_json
                       SKIP_REGULAR_EXPRESSION "summary: kernels skipped")
  list(APPEND _um_tool_tests tool_bench_kernels_quick)

  # The caller's loop against raw OpenCL: every side's result is checked
  # every iteration; one device; skipped where no OpenCL device is found.
  set(_um_loop_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_loop)
  add_test(NAME tool_bench_loop_quick
           COMMAND ${_um_check} 0 "^range +side +per iteration +spread +ratio$"
                   "^1-64 KiB +raw +[0-9.]+ us +[0-9.]+ us +1\\.00$" "^4 KiB-4 MiB +pool_raw +[0-9.]+ us "
                   "^1-64 KiB +pooling gain +[0-9.]+x$" "^  1-64 KiB, unimem_pooled <= 1\\.00x raw: [0-9.]+x"
                   "^  1-64 KiB, pooling gain >= 5\\.0x: [0-9.]+x" "^4 KiB-4 MiB +unimem_unpooled( +[0-9.]+){6}$"
                   "^  loop iteration, 1-64 KiB +[0-9.]+ us +[0-9.]+ us +[0-9.]+x$"
                   "summary: loop ok" "full report: "
                   -- ${_um_tool} bench loop --quick --json ${_um_loop_out}/bench.json)
  set_tests_properties(tool_bench_loop_quick PROPERTIES LABELS "tool;bench" TIMEOUT 300 FIXTURES_SETUP tool_loop_json
                       ENVIRONMENT "POCL_DEVICES=pthread" SKIP_REGULAR_EXPRESSION "summary: loop skipped")
  if(UM_PYTHON3)
    add_test(NAME tool_bench_loop_json
             COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_loop_out}/bench.json loop ok
                     loop:raw_ns loop:unimem_pooled_ns loop:unimem_unpooled_ns loop:pool_raw_ns loop:raw_spread
                     loop:unimem_pooled_ratio loop:pooling_gain loop:hi_bytes)
    set_tests_properties(tool_bench_loop_json PROPERTIES LABELS "tool;bench" TIMEOUT 60 FIXTURES_REQUIRED tool_loop_json
                         SKIP_REGULAR_EXPRESSION "status 'skipped'")
  endif()

  # The same loop from Python, run by the command (bench/pyloop.c runs
  # bench/bench_loop.py): its table, and its rows read back into the report.
  # Not under a sanitizer (the interpreter would load an instrumented
  # extension without the sanitizer's runtime); skipped without the package
  # or pyopencl.
  if(NOT UNIMEM_SANITIZE)
    set(_um_pyloop_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_pyloop)
    add_test(NAME tool_bench_pyloop_quick
             COMMAND ${_um_check} 0 "^sizes +raw +unimem_queue +unimem_events +unimem_unpooled +pool_raw$"
                     "^1-64 KiB( +[0-9.]+){2}( +[0-9.]+ +[0-9.]+ +[0-9.]+x){4}$"
                     "^4 KiB-4 MiB( +[0-9.]+){2}( +[0-9.]+ +[0-9.]+ +[0-9.]+x){4}$"
                     "summary: pyloop ok" "full report: "
                     -- ${_um_tool} bench pyloop --quick --json ${_um_pyloop_out}/bench.json)
    set_tests_properties(tool_bench_pyloop_quick PROPERTIES LABELS "tool;bench;python" TIMEOUT 300
                         FIXTURES_SETUP tool_pyloop_json ENVIRONMENT "POCL_DEVICES=pthread"
                         SKIP_REGULAR_EXPRESSION "summary: pyloop skipped")
    add_test(NAME tool_bench_pyloop_no_python
             COMMAND ${_um_check} 0 "^pyloop: SKIPPED: no interpreter at /nonexistent/python3 " "summary: pyloop skipped"
                     -- ${_um_tool} bench pyloop --quick)
    set_tests_properties(tool_bench_pyloop_no_python PROPERTIES LABELS "tool;bench"
                         ENVIRONMENT "UNIMEM_PYTHON=/nonexistent/python3")
    add_test(NAME tool_bench_pyloop_bad_option
             COMMAND ${_um_check} 1 "summary: pyloop failed" -- ${_um_tool} bench pyloop --reps 0)
    set_tests_properties(tool_bench_pyloop_bad_option PROPERTIES LABELS "tool;bench;python"
                         SKIP_REGULAR_EXPRESSION "summary: pyloop skipped")
    if(UM_PYTHON3)
      add_test(NAME tool_bench_pyloop_json
               COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_pyloop_out}/bench.json pyloop ok
                       pyloop:raw_us pyloop:unimem_queue_us pyloop:unimem_events_us pyloop:unimem_unpooled_us
                       pyloop:pool_raw_us pyloop:unimem_queue_ratio pyloop:pooling_gain pyloop:hi_bytes)
      set_tests_properties(tool_bench_pyloop_json PROPERTIES LABELS "tool;bench;python" TIMEOUT 60
                           FIXTURES_REQUIRED tool_pyloop_json SKIP_REGULAR_EXPRESSION "status 'skipped'")
    endif()
  endif()

  # The SGEMM-shaped step against the raw launch: each side's product is
  # checked after every repetition; skipped where no OpenCL device is found.
  add_test(NAME tool_bench_gemm_quick
           COMMAND ${_um_check} 0 "^size +side +per step +spread +ratio +added$"
                   "^n=16 +raw +[0-9.]+ us +[0-9.]+ us +1\\.00 " "^n=128 +unimem_events +[0-9.]+ us "
                   "^  n=16, unimem_queue <= 1\\.05x raw: [0-9.]+x" "summary: gemm ok"
                   -- ${_um_tool} bench gemm --quick)
  set_tests_properties(tool_bench_gemm_quick PROPERTIES LABELS "tool;bench" TIMEOUT 300
                       ENVIRONMENT "POCL_DEVICES=pthread" SKIP_REGULAR_EXPRESSION "summary: gemm skipped")

  # The instruction-count mode of the transfer benchmark (issue 13): each
  # side's copies run and are reported; skipped without an OpenCL device.
  foreach(_um_side unimem raw)
    add_test(NAME tool_bench_transfer_count_${_um_side}
             COMMAND ${_um_check} 0 "^counted: 2 x 1000 copies of 4096 bytes with an event each, (unimem on|raw OpenCL)"
                     "summary: transfer ok" -- ${_um_tool} bench transfer --count ${_um_side} 2)
    set_tests_properties(tool_bench_transfer_count_${_um_side} PROPERTIES ENVIRONMENT "POCL_DEVICES=pthread"
                         SKIP_REGULAR_EXPRESSION "summary: transfer skipped")
    list(APPEND _um_tool_tests tool_bench_transfer_count_${_um_side})
  endforeach()
  add_test(NAME tool_bench_transfer_count_bad COMMAND ${_um_check} 1 "^usage: .*--count unimem\\|raw ROUNDS" "summary: transfer failed"
           -- ${_um_tool} bench transfer --count both 2)
  list(APPEND _um_tool_tests tool_bench_transfer_count_bad)
  # Its split mode: both sides' issue and whole times, and the difference.
  add_test(NAME tool_bench_transfer_split
           COMMAND ${_um_check} 0 "^split: 3 samples per side of 1000 x 4096-byte copies with an event each, on "
                   "^  unimem  issue +[0-9]+ \\(issuing thread's CPU +[0-9]+\\)   whole +[0-9]+$"
                   "^  raw     issue +[0-9]+ \\(issuing thread's CPU +[0-9]+\\)   whole +[0-9]+$"
                   "^  added   issue +[-+][0-9]+ \\(issuing thread's CPU +[-+][0-9]+\\)   whole +[-+][0-9]+$"
                   "summary: transfer ok" -- ${_um_tool} bench transfer --split 3)
  set_tests_properties(tool_bench_transfer_split PROPERTIES ENVIRONMENT "POCL_DEVICES=pthread"
                       SKIP_REGULAR_EXPRESSION "summary: transfer skipped")
  add_test(NAME tool_bench_transfer_split_bad COMMAND ${_um_check} 1 "^usage: .*--split ROUNDS" "summary: transfer failed"
           -- ${_um_tool} bench transfer --split 0)
  list(APPEND _um_tool_tests tool_bench_transfer_split tool_bench_transfer_split_bad)
  # bench/small_ab.py --split, the A/B of builds by the paired method: two
  # invocations of this build's bench_transfer, its three figures; a bad
  # count refused.
  if(UM_PYTHON3 AND UNIMEM_BUILD_BENCH)
    set(_um_ab ${UM_PYTHON3} ${CMAKE_SOURCE_DIR}/bench/small_ab.py)
    set(_um_n "[-+][0-9]+")
    add_test(NAME small_ab_split
             COMMAND ${_um_check} 0 "^this: --split 3, 2 invocations$"
                     "^  issue, unimem / raw: +median [0-9.]+ \\(min [0-9.]+, max [0-9.]+\\)$"
                     "^  added ns, issue: +median ${_um_n} \\(min ${_um_n}, max ${_um_n}\\)$"
                     "^  added ns, whole sample: +median ${_um_n} \\(min ${_um_n}, max ${_um_n}\\), [0-2] of 2 at or under 300$"
                     -- ${_um_ab} -n 2 --split 3 this=${CMAKE_BINARY_DIR})
    set_tests_properties(small_ab_split PROPERTIES ENVIRONMENT "POCL_DEVICES=pthread"
                         SKIP_REGULAR_EXPRESSION "small_ab: skipped")
    add_test(NAME small_ab_bad COMMAND ${_um_check} 1 "want a count of at least 1"
             -- ${_um_ab} -n 1 --split 0 this=${CMAKE_BINARY_DIR})
    list(APPEND _um_tool_tests small_ab_split small_ab_bad)
  endif()

  # The low-latency wait benchmark (issue 13): every contender present
  # printed, the CPU-time table, its summary; skipped without an OpenCL
  # device.
  set(_um_wait_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_wait)
  add_test(NAME tool_bench_wait_quick
           COMMAND ${_um_check} 0 "^unimem spin 0 +[0-9.]+ +\\[" "^unimem spin +[0-9.]+ +\\[" "^raw blocking +[0-9.]+"
                   "^CPU seconds per second" "^unimem spin 0 +[0-9.]+ +[0-9.]+$" "summary: wait ok"
                   -- ${_um_tool} bench wait --quick --json ${_um_wait_out}/bench.json)
  set_tests_properties(tool_bench_wait_quick PROPERTIES ENVIRONMENT "POCL_DEVICES=pthread"
                       SKIP_REGULAR_EXPRESSION "summary: wait skipped")
  if(UNIMEM_SANITIZE STREQUAL "thread")
    set_tests_properties(tool_bench_wait_quick PROPERTIES ENVIRONMENT
                         "POCL_DEVICES=pthread;TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/tsan_starpu.supp")
  endif()
  list(APPEND _um_tool_tests tool_bench_wait_quick)

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
    add_test(NAME tool_bench_kernels_json
             COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_kernels_out}/bench.json kernels ok
                     chain:unimem_ns chain:raw_ns chain:ratio chain:spread chain:unimem_issue_ns chain:raw_issue_ns)
    set_tests_properties(tool_bench_kernels_json PROPERTIES FIXTURES_REQUIRED tool_kernels_json
                         SKIP_REGULAR_EXPRESSION "status 'skipped'")
    list(APPEND _um_tool_tests tool_bench_stream_json tool_bench_pool_json tool_bench_kernels_json)
  endif()

  # unimem bench net: one quick round over shared memory, or skipped with
  # its reason where UCX or ucx_perftest is missing.
  set(_um_net_out ${CMAKE_CURRENT_BINARY_DIR}/tool_bench_net)
  add_test(NAME tool_bench_net_quick
           COMMAND ${_um_check} 0 "summary: net (ok|skipped)" "(um_net vs ucx_perftest|skipped)"
                   -- ${_um_tool} bench net --quick --rounds 1 --json ${_um_net_out}/bench.json)
  set_tests_properties(tool_bench_net_quick PROPERTIES LABELS "tool;net" TIMEOUT 600
                       ENVIRONMENT "UCX_TLS=posix,self" FIXTURES_SETUP tool_net_json)
  if(UM_PYTHON3 AND UM_HAVE_UCX)
    add_test(NAME tool_bench_net_json
             COMMAND ${UM_PYTHON3} ${_um_pkg}/check_report.py ${_um_net_out}/bench.json net ok
                     net:unimem_mibs net:perftest_mibs net:ratio net:unimem_spread net_latency:unimem_us)
    set_tests_properties(tool_bench_net_json PROPERTIES LABELS "tool;net" TIMEOUT 60
                         FIXTURES_REQUIRED tool_net_json)
  endif()

  add_test(NAME tool_help COMMAND ${_um_check} 0 "^NAME" "^SYNOPSIS" "^OPTIONS" "^ENVIRONMENT" "^EXIT STATUS"
           -- ${_um_tool} bench --help)
  add_test(NAME tool_bad_usage COMMAND ${_um_check} 2 "unknown benchmark 'nosuch'" -- ${_um_tool} bench nosuch)
  set_tests_properties(tool_info tool_stats tool_stats_json tool_bench_stream_quick tool_help tool_bad_usage
                       ${_um_tool_tests} PROPERTIES LABELS "tool" TIMEOUT 300)
endif()

# A static link carries only the parts it calls (static_parts.c).
foreach(variant core full)
  add_executable(static_parts_${variant} ${_um_pkg}/static_parts.c)
  target_compile_options(static_parts_${variant} PRIVATE ${UM_WARNINGS})
  target_link_libraries(static_parts_${variant} PRIVATE unimem_static)
endforeach()
target_compile_definitions(static_parts_core PRIVATE STATIC_PARTS_CORE)
add_test(NAME package_static_parts
         COMMAND ${_um_pkg}/static_parts.sh $<TARGET_FILE:static_parts_core> $<TARGET_FILE:static_parts_full>)

add_test(NAME package_symbols COMMAND ${_um_pkg}/test_symbols.sh $<TARGET_FILE:unimem> ${PROJECT_VERSION_MAJOR}
                                      $<TARGET_FILE:unimem_static>)
add_test(NAME package_install COMMAND ${_um_pkg}/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
                                      ${CMAKE_C_COMPILER} "${_um_san_flags}")
set_tests_properties(package_symbols package_install package_static_parts PROPERTIES LABELS "packaging" TIMEOUT 300
                     SKIP_RETURN_CODE 77)

# Every C example of docs/guide.md compiles (-Wall -Wextra -Werror) and runs;
# those that run kernels of their own link the OpenCL ICD loader where it is
# found, and are left out (said) where it is not.
find_library(UM_OPENCL_LIBRARY OpenCL)
set(_um_guide_opencl "")
if(UM_HAVE_OPENCL AND UM_OPENCL_LIBRARY)
  set(_um_guide_opencl --opencl-library=${UM_OPENCL_LIBRARY} --opencl-include=${UM_OPENCL_INCLUDE_DIR})
endif()
if(UM_PYTHON3)
  add_test(NAME guide_examples
           COMMAND ${UM_PYTHON3} ${_um_pkg}/check_guide.py ${CMAKE_SOURCE_DIR}/docs/guide.md ${CMAKE_C_COMPILER}
                   ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_SOURCE_DIR}/include $<TARGET_FILE:unimem_static>
                   ${_um_guide_opencl} ${_um_san_flags})
  set_tests_properties(guide_examples PROPERTIES LABELS "docs" TIMEOUT 300)
endif()
