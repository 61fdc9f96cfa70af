# Installation: headers, both libraries, the tool, a CMake package with a
# version file, and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS unimem unimem_static
  EXPORT unimemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/unimem.h include/unimem_version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT unimemTargets
  NAMESPACE unimem::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/unimem)

configure_package_config_file(cmake/unimemConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/unimemConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/unimem)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/unimemConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/unimemConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/unimemConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/unimem)

configure_file(cmake/unimem.pc.in ${CMAKE_CURRENT_BINARY_DIR}/unimem.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/unimem.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
