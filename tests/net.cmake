# The um_net tests (label net), included by tests/CMakeLists.txt after the
# test_*.c executables exist.
#
# test_net_*.c (in net/) link the blob-exchange helper
# (bench/net_bootstrap.c, which `unimem bench net` uses too). The data
# path and failure tests run once more per UCX transport of this machine,
# loopback and shared memory only:
#   tcp    UCX_TLS=tcp over lo (peer failure detection: a killed peer is
#          reported at once)
#   posix  UCX_TLS=posix,self: POSIX shared memory (no peer failure
#          detection in UCX 1.13: the timeout finds a killed peer)
#   sysv   UCX_TLS=sysv,self: SysV shared memory (likewise)
#   cma    UCX_TLS=cma,tcp over lo: cross-memory attach with tcp for active
#          messages. UCX 1.13 offers cma only for rendezvous, not as an RMA
#          lane (it has no put/get short or bcopy), so RMA still moves over
#          tcp here; the entry proves the combination works.
# The plain test_net / test_net_fail entries use UCX's own choice.
# test_net_api runs once more without UCX (UNIMEM_UCX_LIBRARY pointing
# nowhere): um_net_create must answer UM_ENOTSUP.
foreach(src ${UM_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  if(name MATCHES "^test_net")
    target_sources(${name} PRIVATE ${CMAKE_SOURCE_DIR}/bench/net_bootstrap.c)
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/bench)
  endif()
endforeach()

# Environment of every net test: one PoCL device, and in TSan builds the
# suppressions of UCX's handlers (net/tsan_net.supp says why), in ASan
# builds those of UCX's own leak (net/lsan_ucx.supp).
set(UM_NET_ENV "POCL_DEVICES=pthread")
if(UNIMEM_SANITIZE STREQUAL "thread")
  list(APPEND UM_NET_ENV "TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/net/tsan_net.supp")
elseif(UNIMEM_SANITIZE STREQUAL "address")
  # UCX's own leak when a peer dies mid-connect (net/lsan_ucx.supp says why).
  list(APPEND UM_NET_ENV "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/net/lsan_ucx.supp")
endif()

if(TARGET test_net AND UM_HAVE_UCX)
  # name|environment, the variables separated by '#'.
  set(UM_NET_TRANSPORTS
    "tcp|UCX_TLS=tcp#UCX_NET_DEVICES=lo"
    "posix|UCX_TLS=posix,self"
    "sysv|UCX_TLS=sysv,self"
    "cma|UCX_TLS=cma,tcp#UCX_NET_DEVICES=lo")
  foreach(t ${UM_NET_TRANSPORTS})
    string(REPLACE "|" ";" parts "${t}")
    list(GET parts 0 tname)
    list(GET parts 1 tenv)
    string(REPLACE "#" ";" tenv "${tenv}")
    foreach(exe test_net test_net_fail)
      if(TARGET ${exe})
        add_test(NAME ${exe}_${tname} COMMAND ${exe} --jobs=1)
        set_tests_properties(${exe}_${tname} PROPERTIES LABELS "net" TIMEOUT 600 SKIP_RETURN_CODE 77
                             ENVIRONMENT "${tenv};${UM_NET_ENV}")
      endif()
    endforeach()
  endforeach()
endif()
foreach(exe test_net test_net_fail test_net_api)
  if(TEST ${exe})
    set_tests_properties(${exe} PROPERTIES TIMEOUT 600 ENVIRONMENT "${UM_NET_ENV}")
  endif()
endforeach()

if(TARGET test_net_api)
  add_test(NAME test_net_api_nolib COMMAND test_net_api --jobs=1 --filter "nolib/*")
  set_tests_properties(test_net_api_nolib PROPERTIES LABELS "net" TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "UNIMEM_UCX_LIBRARY=/nonexistent/libucp.so.0;${UM_NET_ENV}")
endif()

# UCX alone, no unimem (tests/net/ucx_put_peer_killed.c): shows that UCX
# 1.13 over tcp aborts a passive put target whose writer is killed
# mid-put (docs/guide.md). Built so that it keeps compiling; not a test,
# since it demonstrates UCX's behaviour, not unimem's.
if(UM_HAVE_UCX)
  find_library(UM_UCP_LIBRARY NAMES ucp)
  find_library(UM_UCS_LIBRARY NAMES ucs)
  if(UM_UCP_LIBRARY AND UM_UCS_LIBRARY)
    add_executable(ucx_put_peer_killed ${CMAKE_CURRENT_SOURCE_DIR}/net/ucx_put_peer_killed.c)
    target_include_directories(ucx_put_peer_killed PRIVATE ${UM_UCX_INCLUDE_DIR})
    target_compile_definitions(ucx_put_peer_killed PRIVATE _GNU_SOURCE)
    target_compile_options(ucx_put_peer_killed PRIVATE ${UM_WARNINGS})
    target_link_libraries(ucx_put_peer_killed PRIVATE ${UM_UCP_LIBRARY} ${UM_UCS_LIBRARY})
  endif()
endif()
