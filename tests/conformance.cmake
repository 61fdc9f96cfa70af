# The conformance tests that run once per device profile (those that
# include profile.h; support/profile.h lists the profiles), included by
# tests/CMakeLists.txt after the fake CUDA driver's targets exist. The cpu
# run keeps the file's name (test_map); the others add the profile
# (test_map_pocl, test_map_pocl_basic, ...). Labels: core for cpu and the
# fault backend, cuda for the fake driver, opencl for PoCL, gpu for a real
# GPU (which skips, saying why, where there is none).
set(UM_PROFILES "cpu|core" "fault|core")
if(UM_HAVE_CUDA AND TARGET fakecuda_full)
  list(APPEND UM_PROFILES "fakecuda|cuda")
endif()
if(UM_HAVE_OPENCL)
  list(APPEND UM_PROFILES "pocl|opencl" "pocl2|opencl" "pocl-basic|opencl")
endif()
if(UM_HAVE_CUDA)
  list(APPEND UM_PROFILES "gpu|gpu")
endif()

foreach(name ${UM_PROFILED_TESTS})
  foreach(p ${UM_PROFILES})
    string(REPLACE "|" ";" parts "${p}")
    list(GET parts 0 profile)
    list(GET parts 1 label)
    set(env "UNIMEM_TEST_PROFILE=${profile}")
    if(profile STREQUAL "cpu")
      set(test ${name})
    else()
      string(REPLACE "-" "_" suffix ${profile})
      set(test ${name}_${suffix})
    endif()
    if(profile STREQUAL "fakecuda")
      list(APPEND env "UNIMEM_CUDA_LIBRARY=$<TARGET_FILE:fakecuda_full>")
      add_dependencies(${name} fakecuda_full)
    endif()
    add_test(NAME ${test} COMMAND ${name} --jobs=1)
    set_tests_properties(${test} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "${label}"
                         ENVIRONMENT "${env}")
  endforeach()
endforeach()
