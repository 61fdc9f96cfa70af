# Included by tests/CMakeLists.txt after the test_*.c executables exist.

# The model-based randomized test (tests/reliability/test_model.c, its
# model in tests/reliability/model/): once per device configuration, each with a few fixed
# seeds. UNIMEM_MODEL_SEED / UNIMEM_MODEL_OPS turn any of them into a
# replay or a soak run. The OpenCL runs skip (code 77) where there is no
# OpenCL device, and fail when PoCL gives fewer devices than they asked for.
file(GLOB UM_MODEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/reliability/model/*.c)
target_sources(test_model PRIVATE ${UM_MODEL_SOURCES})
target_include_directories(test_model PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/reliability)
target_link_libraries(test_model PRIVATE m)
add_test(NAME test_model_cpu COMMAND test_model --jobs=1 --filter "model/*cpu*")
set_tests_properties(test_model_cpu PROPERTIES LABELS "core" TIMEOUT 300 SKIP_RETURN_CODE 77)
foreach(cfg "pocl_1dev|pthread|1" "pocl_2dev|pthread pthread|2" "pocl_basic|basic|1")
  string(REPLACE "|" ";" cfg "${cfg}")
  list(GET cfg 0 cfg_name)
  list(GET cfg 1 cfg_devices)
  list(GET cfg 2 cfg_count)
  add_test(NAME test_model_${cfg_name} COMMAND test_model --jobs=1 --filter "model/*opencl*")
  set_tests_properties(test_model_${cfg_name} PROPERTIES LABELS "opencl" TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "POCL_DEVICES=${cfg_devices};UNIMEM_MODEL_EXPECT_OPENCL=${cfg_count}")
endforeach()

# The fuzz target without libFuzzer: replays the kept corpus as a plain
# test, so every build (ASan, TSan, valgrind) runs it.
add_executable(fuzz_api_replay ${CMAKE_CURRENT_SOURCE_DIR}/reliability/fuzz/fuzz_api.c)
target_link_libraries(fuzz_api_replay PRIVATE unimem_internals unimem_test_support)
target_compile_definitions(fuzz_api_replay PRIVATE _GNU_SOURCE)
target_compile_options(fuzz_api_replay PRIVATE ${UM_WARNINGS})
target_link_libraries(fuzz_api_replay PRIVATE unimem_static)
file(GLOB UM_FUZZ_CORPUS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/reliability/fuzz/corpus/*)
add_test(NAME fuzz_corpus COMMAND fuzz_api_replay ${UM_FUZZ_CORPUS})
set_tests_properties(fuzz_corpus PROPERTIES TIMEOUT 300 LABELS "core")

# The stress test again, without Criterion: Criterion cannot start under
# TSan (its arena collides with the sanitizer's memory layout), so this is
# the test that the TSan build relies on.
add_executable(stress_standalone ${CMAKE_CURRENT_SOURCE_DIR}/reliability/test_stress.c)
target_link_libraries(stress_standalone PRIVATE unimem_internals unimem_test_support)
target_compile_definitions(stress_standalone PRIVATE _GNU_SOURCE UNIMEM_STRESS_STANDALONE)
target_compile_options(stress_standalone PRIVATE ${UM_WARNINGS})
target_link_libraries(stress_standalone PRIVATE unimem_static)
add_test(NAME stress_standalone COMMAND stress_standalone)
set_tests_properties(stress_standalone PROPERTIES TIMEOUT 300 LABELS "core")


# The unimem command, the installed package (find_package, pkg-config,
# exported symbols, SONAME): tests/packaging/tests.cmake.
include(${CMAKE_CURRENT_SOURCE_DIR}/packaging/tests.cmake)
