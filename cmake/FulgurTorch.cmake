# Finds LibTorch from the PyPI torch wheel (torch.utils.cmake_prefix_path) and decides FULGUR_WITH_CUDA.
# Used by the build and by the installed package (fulgurConfig.cmake), so consumers find Torch the same way.
include_guard(GLOBAL)

if(NOT TARGET torch)
  if(NOT FULGUR_PYTHON)
    foreach(_candidate "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python" "$ENV{FULGUR_VENV}/bin/python")
      if(EXISTS "${_candidate}")
        get_filename_component(FULGUR_PYTHON "${_candidate}" ABSOLUTE)
        break()
      endif()
    endforeach()
  endif()
  if(FULGUR_PYTHON)
    execute_process(COMMAND "${FULGUR_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
      OUTPUT_VARIABLE _fulgur_torch_prefix RESULT_VARIABLE _fulgur_rc ERROR_QUIET)
    if(_fulgur_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${_fulgur_torch_prefix}")
    endif()
  endif()

  # The CUDA wheel's TorchConfig needs a CUDA toolkit at configure time, even for CPU-only use.
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "9.0")   # never probe for a GPU at configure time
  endif()
  find_package(Torch REQUIRED)
  # Torch's imported targets are directory-scoped; make them visible to a project that
  # includes fulgur with add_subdirectory.
  get_property(_fulgur_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _fulgur_imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

if(NOT DEFINED FULGUR_WITH_CUDA)
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    set(_fulgur_cuda_default ON)
  else()
    set(_fulgur_cuda_default OFF)
  endif()
  option(FULGUR_WITH_CUDA "Build the CUDA policies" ${_fulgur_cuda_default})
endif()
