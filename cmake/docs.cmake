# The API reference: `doxygen docs/Doxyfile` from the source root writes
# docs/api/html; here the `docs` target and the docs_doxygen test write into
# the build tree instead. Warnings are errors (WARN_AS_ERROR in the Doxyfile).
find_program(UM_DOXYGEN doxygen)
find_program(UM_DOCS_PYTHON3 python3) # docs/doxygen_filter.py
if(UM_DOXYGEN AND UM_DOCS_PYTHON3)
  set(_um_docs_cmd sh -c "(cat docs/Doxyfile && echo OUTPUT_DIRECTORY=${CMAKE_BINARY_DIR}/docs) | ${UM_DOXYGEN} -")
  add_custom_target(docs COMMAND ${_um_docs_cmd}
                    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                    COMMENT "API reference (Doxygen) in ${CMAKE_BINARY_DIR}/docs/html"
                    VERBATIM)
  if(UNIMEM_BUILD_TESTS)
    add_test(NAME docs_doxygen COMMAND ${_um_docs_cmd} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(docs_doxygen PROPERTIES LABELS "docs" TIMEOUT 300)
  endif()
else()
  message(STATUS "doxygen or python3 not found: no `docs` target (apt-get install doxygen python3)")
endif()
