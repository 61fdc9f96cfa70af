# Installation: headers, both libraries, the tool with its manual page and
# traces, a CMake package with a version file, and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS unimem unimem_static
  EXPORT unimemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/unimem.h include/unimem_version.h include/unimem_dlpack.h
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

# pkg-config: the prefix is derived from the .pc file's own directory
# (${pcfiledir}), unless the install directories are absolute.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(UM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(UM_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _um_pc_up "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
  string(REGEX REPLACE "/$" "" _um_pc_up "${_um_pc_up}")
  set(UM_PC_PREFIX "\${pcfiledir}/${_um_pc_up}")
  set(UM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(UM_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(UM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/unimem.pc.in ${CMAKE_CURRENT_BINARY_DIR}/unimem.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/unimem.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The manual page of the unimem command, and the traces `unimem bench pool`
# replays (cmake/traces.cmake).
if(UNIMEM_BUILD_TOOLS)
  install(FILES docs/unimem.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
  install(FILES ${UM_TRACE_FILES} DESTINATION ${UM_TRACE_INSTALL_DIR})
endif()
