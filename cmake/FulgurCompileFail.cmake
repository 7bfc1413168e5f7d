# fulgur_compile_fail_test(NAME SOURCE [RULE R] EXPECT "text" [TORCH_FREE])
#
# Two ctest cases per call:
#   compile_fail.NAME       builds SOURCE with -DFULGUR_COMPILE_FAIL[=R]; passes only if the build
#                           fails with exactly one error AND the compiler output contains EXPECT;
#   compile_fail.NAME.twin  builds SOURCE without it (the compiling twin); must succeed.
# Where a clang++ is installed (FULGUR_CLANG_CXX), two more check the same under clang:
#   compile_fail.NAME.clang and compile_fail.NAME.twin.clang (syntax only, the g++ build's flags
#   less -Werror: clang's own warnings are the clang build's business, scripts/check.sh clang).
# The cases that include LibTorch reuse the unit tests' precompiled header (clang: its own, made
# by the fixture test compile_fail.clang_pch), so LibTorch is parsed once rather than per case.
# Targets are EXCLUDE_FROM_ALL, so `cmake --build` of the project never trips on them.
find_program(FULGUR_CLANG_CXX NAMES clang++-16 clang++-15 clang++)
function(fulgur_compile_fail_test name source)
  cmake_parse_arguments(ARG "TORCH_FREE" "RULE;EXPECT" "" ${ARGN})
  set(fail_target compile_fail_${name})
  set(twin_target compile_fail_${name}_twin)
  foreach(target ${fail_target} ${twin_target})
    add_library(${target} OBJECT EXCLUDE_FROM_ALL ${source})
    if(ARG_TORCH_FREE)
      target_link_libraries(${target} PRIVATE fulgur::concepts)
    else()
      target_link_libraries(${target} PRIVATE fulgur::fulgur)
      fulgur_reuse_test_pch(${target})  # tests/CMakeLists.txt: LibTorch parsed once, not 40 times
    endif()
  endforeach()
  # The failing build counts errors: a warning made an error would be counted with the rule's.
  target_compile_options(${fail_target} PRIVATE -Wno-error)
  if(ARG_RULE)
    target_compile_definitions(${fail_target} PRIVATE FULGUR_COMPILE_FAIL=1 FULGUR_RULE_${ARG_RULE}=1)
    target_compile_definitions(${twin_target} PRIVATE FULGUR_RULE_${ARG_RULE}=1)
  else()
    target_compile_definitions(${fail_target} PRIVATE FULGUR_COMPILE_FAIL=1)
  endif()
  add_test(NAME compile_fail.${name}
    COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=${fail_target}
            "-DEXPECT=${ARG_EXPECT}" -P ${PROJECT_SOURCE_DIR}/cmake/FulgurExpectBuildFailure.cmake)
  add_test(NAME compile_fail.${name}.twin
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target ${twin_target})
  # Builds in one build tree must not run at the same time as each other.
  set_tests_properties(compile_fail.${name} compile_fail.${name}.twin PROPERTIES RESOURCE_LOCK build_tree LABELS compile_fail)
  if(FULGUR_CLANG_CXX)
    set(clang_pch "${CMAKE_BINARY_DIR}/compile_fail_clang.pch")
    get_property(clang_pch_test GLOBAL PROPERTY FULGUR_CLANG_PCH_TEST)
    if(NOT ARG_TORCH_FREE AND NOT clang_pch_test)
      # clang's own PCH of the header the g++ cases share, made once before the torch cases run.
      add_test(NAME compile_fail.clang_pch
        COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json -DTARGET=${twin_target}
                -DCLANG=${FULGUR_CLANG_CXX} -DMODE=pch -DPCH=${clang_pch}
                -P ${PROJECT_SOURCE_DIR}/cmake/FulgurClangCompileFail.cmake)
      set_tests_properties(compile_fail.clang_pch PROPERTIES FIXTURES_SETUP clang_pch LABELS "compile_fail;clang")
      set_property(GLOBAL PROPERTY FULGUR_CLANG_PCH_TEST TRUE)
    endif()
    foreach(mode fail twin)
      set(target ${fail_target})
      set(test_name compile_fail.${name}.clang)
      if(mode STREQUAL "twin")
        set(target ${twin_target})
        set(test_name compile_fail.${name}.twin.clang)
      endif()
      add_test(NAME ${test_name}
        COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json -DTARGET=${target}
                -DCLANG=${FULGUR_CLANG_CXX} -DMODE=${mode} "-DEXPECT=${ARG_EXPECT}" -DPCH=${clang_pch}
                -P ${PROJECT_SOURCE_DIR}/cmake/FulgurClangCompileFail.cmake)
      set_tests_properties(${test_name} PROPERTIES LABELS "compile_fail;clang")
      if(NOT ARG_TORCH_FREE)
        set_tests_properties(${test_name} PROPERTIES FIXTURES_REQUIRED clang_pch)
      endif()
    endforeach()
  endif()
endfunction()
