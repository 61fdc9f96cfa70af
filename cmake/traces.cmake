# The allocation traces that `unimem bench pool` and bench_pool replay
# (bench/traces). A program finds them relative to its own executable, never
# through a path of the source tree: installed, in
# ${CMAKE_INSTALL_DATADIR}/unimem/traces (UM_TRACE_INSTALLED, relative to
# the bin directory); in the build tree, in bench/traces of the build
# directory (UM_TRACE_BUILT, relative to tools/ and bench/, where the
# programs are built). UNIMEM_TRACE_DIR overrides both at run time.
set(UM_TRACE_INSTALL_DIR ${CMAKE_INSTALL_DATADIR}/unimem/traces)
file(RELATIVE_PATH UM_TRACE_INSTALLED ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_FULL_DATADIR}/unimem/traces)
set(UM_TRACE_BUILT ../bench/traces)
set(UM_TRACE_DEFS UM_BENCH_TRACE_INSTALLED="${UM_TRACE_INSTALLED}" UM_BENCH_TRACE_BUILT="${UM_TRACE_BUILT}")

file(GLOB UM_TRACE_FILES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/traces/*.txt)
if(NOT CMAKE_BINARY_DIR STREQUAL CMAKE_SOURCE_DIR)
  foreach(trace ${UM_TRACE_FILES})
    get_filename_component(name ${trace} NAME)
    configure_file(${trace} ${CMAKE_BINARY_DIR}/bench/traces/${name} COPYONLY)
  endforeach()
endif()
