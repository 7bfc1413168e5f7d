# fulgur_compile_fail_test(NAME SOURCE [RULE R] EXPECT "text" [TORCH_FREE])
#
# Two ctest cases per call (cmake/FulgurCompileCheck.cmake; syntax only, the target's compile command):
#   compile_fail.NAME       compiles SOURCE with -DFULGUR_COMPILE_FAIL[=R]; passes only if it fails
#                           with exactly one error AND the compiler output contains EXPECT;
#   compile_fail.NAME.twin  compiles SOURCE without it (the compiling twin); must succeed.
# In a g++ build where a clang++ is installed (FULGUR_CLANG_CXX), one more checks the failure under
#   clang: compile_fail.NAME.clang (the g++ build's flags less -Werror: clang's own warnings are the
#   clang build's business, scripts/check.sh clang, whose own cases include the twins).
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
  set(check ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json "-DEXPECT=${ARG_EXPECT}")
  set(script -P ${PROJECT_SOURCE_DIR}/cmake/FulgurCompileCheck.cmake)
  add_test(NAME compile_fail.${name} COMMAND ${check} -DTARGET=${fail_target} -DCOMPILER=${CMAKE_CXX_COMPILER} -DMODE=fail ${script})
  add_test(NAME compile_fail.${name}.twin COMMAND ${check} -DTARGET=${twin_target} -DCOMPILER=${CMAKE_CXX_COMPILER} -DMODE=twin ${script})
  set_tests_properties(compile_fail.${name} compile_fail.${name}.twin PROPERTIES LABELS compile_fail)
  if(FULGUR_CLANG_CXX AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(clang_pch "${CMAKE_BINARY_DIR}/compile_fail_clang.pch")
    set(clang -DCOMPILER=${FULGUR_CLANG_CXX} -DCLANG=ON -DPCH=${clang_pch})
    get_property(clang_pch_test GLOBAL PROPERTY FULGUR_CLANG_PCH_TEST)
    if(NOT ARG_TORCH_FREE AND NOT clang_pch_test)
      # clang's own PCH of the header the g++ cases share, made once before the torch cases run.
      add_test(NAME compile_fail.clang_pch COMMAND ${check} -DTARGET=${twin_target} ${clang} -DMODE=pch ${script})
      set_tests_properties(compile_fail.clang_pch PROPERTIES FIXTURES_SETUP clang_pch LABELS "compile_fail;clang")
      set_property(GLOBAL PROPERTY FULGUR_CLANG_PCH_TEST TRUE)
    endif()
    # The failing case only: its one-error check already shows the rest of the source compiles under clang,
    # and the twins, compiled by g++ above, cost 9 s each (scripts/check.sh clang builds them all).
    add_test(NAME compile_fail.${name}.clang COMMAND ${check} -DTARGET=${fail_target} ${clang} -DMODE=fail ${script})
    set_tests_properties(compile_fail.${name}.clang PROPERTIES LABELS "compile_fail;clang")
    if(NOT ARG_TORCH_FREE)
      set_tests_properties(compile_fail.${name}.clang PROPERTIES FIXTURES_REQUIRED clang_pch)
    endif()
  endif()
endfunction()
