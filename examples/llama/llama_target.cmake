# The Llama runner as a target shared by examples/llama/, tests/llama/, bench/llama/ and the llama.cpp integration
# (any may be configured without the others, so each includes this file): its headers (fairkv_llama_headers) and
# the one compiled unit, plan_layer.cpp, where every policy's planning is instantiated once (plan_layer.hpp).
include_guard(GLOBAL)

find_package(Threads REQUIRED)

option(FAIRKV_LLAMA_NATIVE "Compile the Llama runner for the host CPU (-march=native: AVX2/AVX-VNNI kernels)" ON)

add_library(fairkv_llama_headers INTERFACE)
target_include_directories(fairkv_llama_headers INTERFACE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(fairkv_llama_headers INTERFACE fairkv::fairkv Threads::Threads)
target_compile_features(fairkv_llama_headers INTERFACE cxx_std_20)
# The forward pass is unusably slow unoptimised (a test runs the 135M model): optimise in every configuration.
# Threads come from thread_pool.hpp (not OpenMP, see there); -fopenmp-simd only honours `omp simd` reductions.
# Eigen's own threading is off: the runner parallelises across heads and rows itself.
target_compile_options(fairkv_llama_headers INTERFACE -O3 -fopenmp-simd $<$<BOOL:${FAIRKV_LLAMA_NATIVE}>:-march=native>)
# FAIRKV_SOURCE_DIR: where model names find the models scripts/ install (model_path.hpp).
target_compile_definitions(fairkv_llama_headers INTERFACE EIGEN_DONT_PARALLELIZE FAIRKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

add_library(fairkv_llama STATIC ${CMAKE_CURRENT_LIST_DIR}/plan_layer.cpp)
target_link_libraries(fairkv_llama PUBLIC fairkv_llama_headers)
