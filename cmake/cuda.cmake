# CUDA and NCCL detection. Sets SN_HAVE_CUDA, SN_HAVE_NCCL, SN_CUDA_SOURCES and defines
# sn_cuda_link(target) to add the CUDA runtime (and NCCL) to a target.
set(SN_HAVE_CUDA 0)
set(SN_HAVE_NCCL 0)
set(SN_CUDA_SOURCES "")
function(sn_cuda_link target)
endfunction()
if(NOT SN_WITH_CUDA STREQUAL "OFF" OR SN_WITH_NCCL STREQUAL "ON")
  if(SN_WITH_CUDA STREQUAL "ON" OR SN_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "CUDA kernels are not part of this build yet (SN_WITH_CUDA/SN_WITH_NCCL=ON)")
  endif()
endif()
