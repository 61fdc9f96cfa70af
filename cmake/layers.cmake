# The layers of src/ (src/README.md), each folder an object library that
# sees only itself and the folders below it: their include directories and
# their UM__SEES_<FOLDER> definitions. Every folder's header starts with
# #ifndef UM__SEES_<FOLDER> #error, so a forbidden #include fails to compile
# even by a relative path.
#
# um_layer_objects(VARIANT OUT [DEFINES d...] [OPTIONS o...] [PIC]) builds
# the layers once more as VARIANT_<folder> object libraries and sets OUT
# to their objects, for a library to be made of.

set(UM_LAYERS base backend device mem core ops interop net_ucx net)

set(UM_LAYER_base_SOURCES
  src/base/errors.c src/base/options.c src/base/fork.c src/base/pagelock.c src/base/sizeclass.c
  src/base/spin.c src/base/thread.c src/base/vendor_lib.c)
set(UM_LAYER_base_SEES base)

set(UM_LAYER_backend_SOURCES ${UM_BACKEND_SOURCES})
set(UM_LAYER_backend_SEES base backend)

set(UM_LAYER_device_SOURCES src/device/device.c src/device/peer.c src/device/backend_calls.c)
set(UM_LAYER_device_SEES base backend device)

set(UM_LAYER_mem_SOURCES
  src/mem/hooks.c src/mem/block.c src/mem/block_return.c src/mem/pool.c src/mem/tcache.c
  src/mem/quarantine.c src/mem/trim.c src/mem/extents.c src/mem/segment.c)
set(UM_LAYER_mem_SEES base backend device mem)

set(UM_LAYER_core_SOURCES
  src/core/buffer_state.c src/core/buffer.c src/core/manager.c src/core/stats.c src/core/mapfile.c
  src/core/riders.c src/core/thread.c src/core/trace.c src/core/observe.c src/core/snapshot.c
  src/core/history.c)
set(UM_LAYER_core_SEES base backend device mem core)

set(UM_LAYER_ops_SOURCES
  src/ops/event.c src/ops/engine.c src/ops/op.c src/ops/complete.c src/ops/tokens.c src/ops/brackets.c
  src/ops/held.c src/ops/group.c src/ops/path.c src/ops/staged.c src/ops/copy.c src/ops/map.c
  src/ops/stream.c src/ops/synchronize.c src/ops/queue.c)
set(UM_LAYER_ops_SEES base backend device mem core ops)

set(UM_LAYER_interop_SOURCES src/interop/access.c src/interop/dlpack.c)
set(UM_LAYER_interop_SEES base backend device mem core ops interop)

# um_net's transport over UCX: a backend of net/, it sees net.h (the
# transport table) and what net.h needs, nothing of the manager.
set(UM_LAYER_net_ucx_SOURCES ${UM_NET_UCX_SOURCES})
set(UM_LAYER_net_ucx_SEES base backend net net_ucx)

set(UM_LAYER_net_SOURCES src/net/net.c src/net/net_ops.c src/net/staging.c)
set(UM_LAYER_net_SEES base backend device mem core ops interop net)

# The folder of each UM__SEES_ name; types.h (src/) comes with device/.
function(_um_layer_dir sees out)
  if(sees STREQUAL "net_ucx")
    set(${out} ${PROJECT_SOURCE_DIR}/src/net/ucx PARENT_SCOPE)
  elseif(sees STREQUAL "device")
    set(${out} ${PROJECT_SOURCE_DIR}/src/device ${PROJECT_SOURCE_DIR}/src PARENT_SCOPE)
  else()
    set(${out} ${PROJECT_SOURCE_DIR}/src/${sees} PARENT_SCOPE)
  endif()
endfunction()

# Tests that look inside (tests/internals, the fault backend) see the
# layers up to core/, and the UCX entry points (a net test checks the
# loader): link this. Operations are tested through the public API.
set(UM_INTERNALS_SEE base backend device mem core net_ucx)
add_library(unimem_internals INTERFACE)
foreach(sees ${UM_INTERNALS_SEE})
  _um_layer_dir(${sees} dirs)
  string(TOUPPER ${sees} upper)
  target_include_directories(unimem_internals INTERFACE ${dirs})
  target_compile_definitions(unimem_internals INTERFACE UM__SEES_${upper})
endforeach()
target_include_directories(unimem_internals INTERFACE ${PROJECT_SOURCE_DIR}/include ${UM_BACKEND_INCLUDES})

function(um_layer_objects variant out)
  cmake_parse_arguments(L "PIC" "" "DEFINES;OPTIONS;EXTRA_BASE" ${ARGN})
  set(objects "")
  foreach(layer ${UM_LAYERS})
    set(sources ${UM_LAYER_${layer}_SOURCES})
    if(layer STREQUAL "base")
      list(APPEND sources ${L_EXTRA_BASE})
    endif()
    if(NOT sources)
      continue()
    endif()
    list(TRANSFORM sources PREPEND ${PROJECT_SOURCE_DIR}/)
    set(target ${variant}_${layer})
    add_library(${target} OBJECT ${sources})
    foreach(sees ${UM_LAYER_${layer}_SEES})
      _um_layer_dir(${sees} dirs)
      string(TOUPPER ${sees} upper)
      target_include_directories(${target} PRIVATE ${dirs})
      target_compile_definitions(${target} PRIVATE UM__SEES_${upper})
    endforeach()
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${UM_BACKEND_INCLUDES})
    target_compile_definitions(${target} PRIVATE _GNU_SOURCE ${UM_BACKEND_DEFS} ${L_DEFINES})
    target_compile_options(${target} PRIVATE ${UM_WARNINGS} ${L_OPTIONS})
    set_target_properties(${target} PROPERTIES C_VISIBILITY_PRESET hidden)
    if(L_PIC)
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    endif()
    list(APPEND objects $<TARGET_OBJECTS:${target}>)
  endforeach()
  set(${out} ${objects} PARENT_SCOPE)
endfunction()
