# CUDA and NCCL detection. Sets SN_HAVE_CUDA, SN_HAVE_NCCL, SN_CUDA_SOURCES and defines
# sn_cuda_link(target) to add the CUDA runtime (and NCCL) to a target.
# AUTO: the CUDA kernels are built wherever nvcc is found (PATH, CUDACXX or /usr/local/cuda), also
# on a machine without a GPU (CI compiles them with warnings as errors; their tests then report
# SKIPPED). Architectures: CMAKE_CUDA_ARCHITECTURES, default 80;90 (A100, H100/H200).
set(SN_HAVE_CUDA 0)
set(SN_HAVE_NCCL 0)
set(SN_CUDA_SOURCES "")

if(SN_WITH_NCCL STREQUAL "ON" AND SN_WITH_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "SN_WITH_NCCL=ON needs CUDA, but SN_WITH_CUDA=OFF")
endif()

if(NOT SN_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(SN_HAVE_CUDA 1)
  elseif(SN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SN_WITH_CUDA=ON but no CUDA compiler (nvcc) and toolkit were found; "
                        "set CUDACXX or CMAKE_CUDA_COMPILER")
  endif()
endif()

if(SN_HAVE_CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # Our .cu files: every warning is an error, also the host compiler's (-Wall -Wextra).
  set(SN_CUDA_FLAGS -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-fvisibility=hidden
      --expt-relaxed-constexpr -lineinfo)
  set(SN_CUDA_SOURCES
    src/cuda/common.cu
    src/cuda/rownorm_fwd.cu
    src/cuda/rownorm_bwd.cu
    src/cuda/layernorm.cu
    src/cuda/layernorm_bwd.cu
    src/cuda/rmsnorm.cu
    src/cuda/batchnorm.cu
    src/cuda/batchnorm_bwd.cu
    src/cuda/groupnorm.cu
    src/cuda/groupnorm_bwd.cu
    src/cuda/fold.cu
    dist/syncbn_device.c
    dist/syncbn_cuda.cu)
endif()

if(SN_HAVE_CUDA AND NOT SN_WITH_NCCL STREQUAL "OFF")
  find_path(SN_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
            PATH_SUFFIXES include)
  # libnccl.so.2 by name too: NCCL's pip wheel (nvidia-nccl-cu13) ships no libnccl.so link
  find_library(SN_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT}/lib ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(SN_NCCL_INCLUDE_DIR AND SN_NCCL_LIBRARY)
    set(SN_HAVE_NCCL 1)
    list(APPEND SN_CUDA_SOURCES dist/comm_nccl.c)
  endif()
endif()
if(SN_WITH_NCCL STREQUAL "ON" AND NOT SN_HAVE_NCCL)
  message(FATAL_ERROR "SN_WITH_NCCL=ON but nccl.h and libnccl were not found (set NCCL_HOME)")
endif()

# The CUDA runtime (shared, one copy per process for the library and the program) and NCCL.
function(sn_cuda_link target scope)
  if(SN_HAVE_CUDA)
    target_link_libraries(${target} ${scope} CUDA::cudart)
  endif()
  if(SN_HAVE_NCCL)
    target_include_directories(${target} ${scope} ${SN_NCCL_INCLUDE_DIR})
    target_link_libraries(${target} ${scope} ${SN_NCCL_LIBRARY})
  endif()
endfunction()
