# llama.cpp for the fairkv-llamacpp integration (examples/llamacpp, tests/llamacpp): found only when asked for,
# so a build without it is unchanged.
#   -DFAIRKV_LLAMACPP=ON      the build of scripts/build_llamacpp.sh (.cache/llamacpp/install-<version>)
#   -DFAIRKV_LLAMACPP=<dir>   any llama.cpp install prefix (holding include/llama.h and lib*/libllama.*)
#   unset / OFF               the integration is not built
# Defines the targets fairkv_llamacpp, alias fairkv::llamacpp (the library's llama.cpp adapter, include/fairkv/llamacpp:
# fairkv + llama.h + libllama + ggml) and fairkv_llamacpp_integration (with
# examples/llamacpp's headers and its compiled unit); callers test for the latter (targets are global, this file is read once).
include_guard(GLOBAL)

set(FAIRKV_LLAMACPP "OFF" CACHE STRING "Build the llama.cpp integration: ON (scripts/build_llamacpp.sh's build) or a llama.cpp install prefix")
if(FAIRKV_LLAMACPP STREQUAL "" OR NOT FAIRKV_LLAMACPP OR FAIRKV_LLAMACPP STREQUAL "OFF")
  return()
endif()

if(FAIRKV_LLAMACPP STREQUAL "ON")
  set(_fairkv_llamacpp_prefix "${PROJECT_SOURCE_DIR}/.cache/llamacpp/install-0.3.36")
else()
  get_filename_component(_fairkv_llamacpp_prefix "${FAIRKV_LLAMACPP}" ABSOLUTE)
endif()

find_path(FAIRKV_LLAMACPP_INCLUDE_DIR llama.h PATHS "${_fairkv_llamacpp_prefix}/include" NO_DEFAULT_PATH)
find_library(FAIRKV_LLAMACPP_LIBRARY llama PATHS "${_fairkv_llamacpp_prefix}/lib" "${_fairkv_llamacpp_prefix}/lib64"
             NO_DEFAULT_PATH)
find_library(FAIRKV_GGML_LIBRARY ggml PATHS "${_fairkv_llamacpp_prefix}/lib" "${_fairkv_llamacpp_prefix}/lib64"
             NO_DEFAULT_PATH)
find_library(FAIRKV_GGML_BASE_LIBRARY ggml-base PATHS "${_fairkv_llamacpp_prefix}/lib"
             "${_fairkv_llamacpp_prefix}/lib64" NO_DEFAULT_PATH)
if(NOT FAIRKV_LLAMACPP_INCLUDE_DIR OR NOT FAIRKV_LLAMACPP_LIBRARY OR NOT FAIRKV_GGML_BASE_LIBRARY)
  message(FATAL_ERROR "FAIRKV_LLAMACPP=${FAIRKV_LLAMACPP}: no llama.cpp install under '${_fairkv_llamacpp_prefix}' "
                      "(include/llama.h, lib/libllama, lib/libggml-base); run scripts/build_llamacpp.sh")
endif()

# The state layout the integration parses is llama.cpp's at LLAMA_STATE_SEQ_VERSION 3 (llama-cpp-python 0.3.36);
# another version still builds, and the program refuses its states at run time with the version in the message.
file(STRINGS "${FAIRKV_LLAMACPP_INCLUDE_DIR}/llama.h" _fairkv_state_version REGEX "#define LLAMA_STATE_SEQ_VERSION")
if(NOT _fairkv_state_version MATCHES "LLAMA_STATE_SEQ_VERSION +3$")
  message(WARNING "llama.cpp at ${_fairkv_llamacpp_prefix}: '${_fairkv_state_version}' is not the pinned state "
                  "version 3; fairkv-llamacpp will refuse to compress its states")
endif()

add_library(fairkv_llamacpp INTERFACE)
add_library(fairkv::llamacpp ALIAS fairkv_llamacpp)
target_include_directories(fairkv_llamacpp INTERFACE ${FAIRKV_LLAMACPP_INCLUDE_DIR})
target_link_libraries(fairkv_llamacpp INTERFACE fairkv::fairkv ${FAIRKV_LLAMACPP_LIBRARY} ${FAIRKV_GGML_BASE_LIBRARY})
if(FAIRKV_GGML_LIBRARY)
  target_link_libraries(fairkv_llamacpp INTERFACE ${FAIRKV_GGML_LIBRARY})
endif()
# The integration's headers (examples/llamacpp) over the runner's (segment parsing, chat template, CLI helpers).
include(${PROJECT_SOURCE_DIR}/examples/llama/llama_target.cmake)
# Its one compiled unit: planning over llama.cpp's f16 keys (plan_layer_f16.hpp).
add_library(fairkv_llamacpp_integration STATIC ${PROJECT_SOURCE_DIR}/examples/llamacpp/plan_layer_f16.cpp)
target_include_directories(fairkv_llamacpp_integration PUBLIC ${PROJECT_SOURCE_DIR}/examples/llamacpp)
target_link_libraries(fairkv_llamacpp_integration PUBLIC fairkv_llama fairkv_llamacpp)
message(STATUS "fairkv: llama.cpp integration against ${_fairkv_llamacpp_prefix}")
