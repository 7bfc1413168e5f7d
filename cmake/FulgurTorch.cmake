# Finds LibTorch from the PyPI torch wheel and decides FULGUR_WITH_CUDA. Used by the build and by
# the installed package (fulgurConfig.cmake), so consumers find Torch the same way:
#   - a Torch already found (a `torch` target) is used as it is;
#   - else Torch_DIR / CMAKE_PREFIX_PATH, if the consumer set them;
#   - else the torch of FULGUR_PYTHON (a Python whose `import torch` works), of $FULGUR_VENV, of
#     the source tree's .venv, and last the LibTorch fulgur was built with (FULGUR_BUILT_WITH_TORCH_DIR).
# It changes nothing else in the caller's scope: the CUDA wheel's TorchConfig wants
# TORCH_CUDA_ARCH_LIST and a CUDA toolkit at configure time, and they are set only inside a block.
include_guard(GLOBAL)

if(NOT TARGET torch)
  block(SCOPE_FOR VARIABLES PROPAGATE Torch_FOUND Torch_DIR TORCH_LIBRARIES TORCH_INCLUDE_DIRS TORCH_CXX_FLAGS
                                      TORCH_INSTALL_PREFIX TORCH_CUDA_LIBRARIES)
    if(NOT FULGUR_PYTHON)
      foreach(_candidate "$ENV{FULGUR_VENV}/bin/python" "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
        if(EXISTS "${_candidate}")
          get_filename_component(FULGUR_PYTHON "${_candidate}" ABSOLUTE)
          break()
        endif()
      endforeach()
    endif()
    set(_hints "")
    if(FULGUR_PYTHON)
      execute_process(COMMAND "${FULGUR_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
        OUTPUT_VARIABLE _torch_prefix RESULT_VARIABLE _rc ERROR_QUIET)
      if(_rc EQUAL 0)
        list(APPEND _hints "${_torch_prefix}/Torch")
      endif()
    endif()
    if(FULGUR_BUILT_WITH_TORCH_DIR)
      list(APPEND _hints "${FULGUR_BUILT_WITH_TORCH_DIR}")
    endif()
    if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
      set(TORCH_CUDA_ARCH_LIST "9.0")  # never probe for a GPU at configure time
    endif()
    # Two warnings LibTorch's config would print on every configure, neither about this project:
    # - "library kineto not found": TorchConfig looks for a separate kineto library, but the PyPI
    #   wheel links Kineto into libtorch_cpu. Where there is no kineto library beside it, the search
    #   is pointed at libtorch_cpu (already linked: naming it twice changes nothing).
    # - "pytorch is not compatible with `CMAKE_CUDA_ARCHITECTURES`": the CUDA wheel's config enables
    #   the CUDA language itself, and under policy CMP0104 NEW that defines CMAKE_CUDA_ARCHITECTURES,
    #   which it then warns about and ignores (it takes TORCH_CUDA_ARCH_LIST). fulgur compiles no CUDA
    #   source, so CMP0104 is OLD while the config runs: the variable stays undefined. A project that
    #   enables CUDA itself before, or sets CMAKE_CUDA_ARCHITECTURES, still gets LibTorch's warning,
    #   which is then about its own setting.
    foreach(_dir IN LISTS _hints Torch_DIR)
      get_filename_component(_lib "${_dir}/../../../lib" ABSOLUTE)
      if(NOT kineto_LIBRARY AND EXISTS "${_lib}/libtorch_cpu.so" AND NOT EXISTS "${_lib}/libkineto.a"
         AND NOT EXISTS "${_lib}/libkineto.so")
        set(kineto_LIBRARY "${_lib}/libtorch_cpu.so")
      endif()
    endforeach()
    cmake_policy(PUSH)
    cmake_policy(SET CMP0104 OLD)
    find_package(Torch REQUIRED HINTS ${_hints})
    cmake_policy(POP)
  endblock()
endif()

if(NOT DEFINED FULGUR_WITH_CUDA)
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    set(_fulgur_cuda_default ON)
  else()
    set(_fulgur_cuda_default OFF)
  endif()
  option(FULGUR_WITH_CUDA "Build the CUDA policies" ${_fulgur_cuda_default})
endif()
