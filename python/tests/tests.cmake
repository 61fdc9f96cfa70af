# CTest entries of the Python package (label "python"): pytest over
# python/tests with the build tree's package first on the path, and an
# install check. Included from python/CMakeLists.txt.
#
# Sanitizer builds: /usr/bin/python3 itself is not instrumented, so the
# ASan runtime must be loaded before anything else (LD_PRELOAD), leak
# detection is off (the interpreter keeps its own objects until exit, which
# LeakSanitizer reports), and PYTHONMALLOC=malloc sends Python's objects
# through ASan's allocator so that a use after free of one is caught. Under
# TSan the uninstrumented interpreter reports races of its own: the Python
# tests are not run there.

# The OpenCL managers of the tests are PoCL's (two devices in one context),
# and only PoCL's platform is opened (UNIMEM_OPENCL_PLATFORM): beside it a
# GPU's platform would add devices of another context, and its context's
# creation and release to every manager, hundreds of milliseconds each on
# NVIDIA's driver, for the hundreds of managers test_fuzz.py and
# test_lifetime.py make.
set(_um_py_env
  "PYTHONPATH=${CMAKE_CURRENT_BINARY_DIR}"
  "PYTHONDONTWRITEBYTECODE=1"
  "POCL_DEVICES=pthread pthread"
  "UNIMEM_OPENCL_PLATFORM=Portable Computing Language"
  "UM_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

if(UNIMEM_SANITIZE STREQUAL "thread")
  message(STATUS "TSan build: the Python tests are not registered (the interpreter is not instrumented)")
  return()
elseif(UNIMEM_SANITIZE STREQUAL "address")
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-resource-dir
                    OUTPUT_VARIABLE _um_rdir OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(_um_asan_rt ${_um_rdir}/lib/linux/libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)
  else()
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE _um_asan_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(NOT EXISTS "${_um_asan_rt}")
    message(WARNING "ASan runtime not found (${_um_asan_rt}): the Python tests are not registered")
    return()
  endif()
  list(APPEND _um_py_env "LD_PRELOAD=${_um_asan_rt}" "PYTHONMALLOC=malloc" "UM_EXPECT_ASAN=1"
       "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1"
       "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()

set(_um_pytest ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider)
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pytest, hypothesis, numpy"
                RESULT_VARIABLE _um_py_modules OUTPUT_QUIET ERROR_QUIET)
if(NOT _um_py_modules EQUAL 0)
  set(_um_py_missing "${Python3_EXECUTABLE} cannot import pytest, hypothesis and numpy (apt-get install python3-pytest python3-hypothesis python3-numpy)")
  message(WARNING "${_um_py_missing}: the Python tests will skip")
  set(_um_pytest ${Python3_EXECUTABLE} -c "import sys; print('SKIP: ${_um_py_missing}'); sys.exit(77)")
endif()
# Everything but the hypothesis fuzzing and the GPU tests, then the fuzzing
# (longer) apart, then the GPU tests (label gpu: they skip, saying why,
# where there is no NVIDIA GPU).
add_test(NAME python_api
         COMMAND ${_um_pytest} -m "not gpu" ${CMAKE_CURRENT_SOURCE_DIR}/tests
                 --ignore=${CMAKE_CURRENT_SOURCE_DIR}/tests/test_fuzz.py)
add_test(NAME python_fuzz COMMAND ${_um_pytest} ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_fuzz.py)
add_test(NAME python_gpu COMMAND ${_um_pytest} -rs -m gpu ${CMAKE_CURRENT_SOURCE_DIR}/tests
                 --ignore=${CMAKE_CURRENT_SOURCE_DIR}/tests/test_fuzz.py)
add_test(NAME python_install
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/install_check.sh ${CMAKE_BINARY_DIR} ${Python3_EXECUTABLE})
# pip install and a wheel, as a Python user builds the package (setup.py's CMake build, no registry).
add_test(NAME python_pip COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/pip_check.sh ${CMAKE_SOURCE_DIR} ${Python3_EXECUTABLE})
# examples/python: each runs as a test (one without what it needs prints a
# SKIP line and exits 0).
file(GLOB _um_py_examples CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/examples/python/*.py)
set(_um_py_example_tests "")
foreach(ex ${_um_py_examples})
  get_filename_component(name ${ex} NAME_WE)
  add_test(NAME python_example_${name} COMMAND ${Python3_EXECUTABLE} ${ex})
  list(APPEND _um_py_example_tests python_example_${name})
endforeach()
foreach(t python_api python_fuzz python_gpu python_install python_pip ${_um_py_example_tests})
  # The tests' scratch files (hypothesis keeps none: see conftest.py) stay
  # in the build tree.
  set_tests_properties(${t} PROPERTIES LABELS "python" TIMEOUT 600 SKIP_RETURN_CODE 77
                       WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR} ENVIRONMENT "${_um_py_env}")
endforeach()
set_tests_properties(python_gpu PROPERTIES LABELS "python;gpu")
if(TARGET fakecuda_full)
  add_dependencies(unimem_python fakecuda_full) # test_frameworks runs the allocator against it
endif()
