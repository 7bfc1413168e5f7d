# fulgur_compile_fail_test(NAME SOURCE [RULE R] EXPECT "text" [TORCH_FREE] [OWN_TWIN])
#
# ctest cases per call (cmake/FulgurCompileCheck.cmake; syntax only, the target's compile command):
#   compile_fail.NAME       compiles SOURCE with -DFULGUR_COMPILE_FAIL[=R]; passes only if it fails
#                           with exactly one error AND the compiler output contains EXPECT;
#   its compiling twin      SOURCE without it; must compile. The twins of the cases that include
#                           LibTorch are compiled together, each in a namespace of its own, by one case,
#                           compile_fail.twins (fulgur_compile_fail_twins(), called once after the last
#                           case): g++ instantiates a precompiled header's pending templates again in every
#                           translation unit (~6 s of LibTorch's, whatever the case), so 33 twins cost one
#                           of those instead of 33. TORCH_FREE cases, and OWN_TWIN ones (a source that
#                           needs include directories of its own), keep compile_fail.NAME.twin.
# In a g++ build where a clang++ is installed (FULGUR_CLANG_CXX), one more checks the failure under
#   clang: compile_fail.NAME.clang (the g++ build's flags less -Werror: clang's own warnings are the
#   clang build's business, scripts/check.sh clang, whose own cases include the twins).
# The cases that include LibTorch reuse the unit tests' precompiled header (clang: its own, made
# by the fixture test compile_fail.clang_pch), so LibTorch is parsed once rather than per case.
# Targets are EXCLUDE_FROM_ALL, so `cmake --build` of the project never trips on them.
find_program(FULGUR_CLANG_CXX NAMES clang++-16 clang++-15 clang++)
function(fulgur_compile_fail_test name source)
  cmake_parse_arguments(ARG "TORCH_FREE;OWN_TWIN" "RULE;EXPECT" "" ${ARGN})
  set(fail_target compile_fail_${name})
  set(twin_target compile_fail_${name}_twin)
  set(targets ${fail_target})
  if(ARG_TORCH_FREE OR ARG_OWN_TWIN)
    list(APPEND targets ${twin_target})
  else()
    get_filename_component(absolute_source "${source}" ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY FULGUR_SHARED_TWINS "${name}|${absolute_source}|${ARG_RULE}")
  endif()
  foreach(target ${targets})
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
    if(TARGET ${twin_target})
      target_compile_definitions(${twin_target} PRIVATE FULGUR_RULE_${ARG_RULE}=1)
    endif()
  else()
    target_compile_definitions(${fail_target} PRIVATE FULGUR_COMPILE_FAIL=1)
  endif()
  set(check ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json "-DEXPECT=${ARG_EXPECT}")
  set(script -P ${PROJECT_SOURCE_DIR}/cmake/FulgurCompileCheck.cmake)
  add_test(NAME compile_fail.${name} COMMAND ${check} -DTARGET=${fail_target} -DCOMPILER=${CMAKE_CXX_COMPILER} -DMODE=fail ${script})
  set_tests_properties(compile_fail.${name} PROPERTIES LABELS compile_fail)
  if(TARGET ${twin_target})
    add_test(NAME compile_fail.${name}.twin COMMAND ${check} -DTARGET=${twin_target} -DCOMPILER=${CMAKE_CXX_COMPILER} -DMODE=twin ${script})
    set_tests_properties(compile_fail.${name}.twin PROPERTIES LABELS compile_fail)
  endif()
  if(FULGUR_CLANG_CXX AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(clang_pch "${CMAKE_BINARY_DIR}/compile_fail_clang.pch")
    set(clang -DCOMPILER=${FULGUR_CLANG_CXX} -DCLANG=ON -DPCH=${clang_pch})
    get_property(clang_pch_test GLOBAL PROPERTY FULGUR_CLANG_PCH_TEST)
    if(NOT ARG_TORCH_FREE AND NOT clang_pch_test)
      # clang's own PCH of the header the g++ cases share, made once before the torch cases run.
      # (mode pch drops the case's own macros: the failing case's command serves)
      add_test(NAME compile_fail.clang_pch COMMAND ${check} -DTARGET=${fail_target} ${clang} -DMODE=pch ${script})
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

# The shared twins (see the top): one generated source, each twin in namespace twin_NAME with its rule's
# macro around its source. Every source's includes come first, at global scope, so that a header first
# included inside a twin's namespace cannot happen; the sources' own includes are then no-ops.
function(fulgur_compile_fail_twins)
  get_property(twins GLOBAL PROPERTY FULGUR_SHARED_TWINS)
  if(NOT twins)
    return()
  endif()
  set(includes "")
  set(bodies "")
  foreach(twin IN LISTS twins)
    string(REPLACE "|" ";" parts "${twin}")
    list(GET parts 0 name)
    list(GET parts 1 source)
    list(GET parts 2 rule)
    get_filename_component(directory "${source}" DIRECTORY)
    file(STRINGS "${source}" lines REGEX "^#include ")
    foreach(line IN LISTS lines)
      if(line MATCHES "^#include \"([^\"]+)\"" AND EXISTS "${directory}/${CMAKE_MATCH_1}")
        get_filename_component(header "${directory}/${CMAKE_MATCH_1}" ABSOLUTE)
        set(line "#include \"${header}\"")
      endif()
      list(APPEND includes "${line}")
    endforeach()
    string(APPEND bodies "namespace twin_${name} {\n")
    if(rule)
      string(APPEND bodies "#define FULGUR_RULE_${rule} 1\n")
    endif()
    string(APPEND bodies "#include \"${source}\"\n")
    if(rule)
      string(APPEND bodies "#undef FULGUR_RULE_${rule}\n")
    endif()
    string(APPEND bodies "}  // namespace twin_${name}\n")
  endforeach()
  list(REMOVE_DUPLICATES includes)
  list(JOIN includes "\n" includes)
  set(generated "${CMAKE_CURRENT_BINARY_DIR}/compile_fail_twins.cpp")
  file(CONFIGURE OUTPUT "${generated}" @ONLY CONTENT
"// Generated by cmake/FulgurCompileFail.cmake: the compile-fail cases' twins, which must compile.
@includes@

@bodies@")
  add_library(compile_fail_twins OBJECT EXCLUDE_FROM_ALL "${generated}")
  target_link_libraries(compile_fail_twins PRIVATE fulgur::fulgur)
  fulgur_reuse_test_pch(compile_fail_twins)
  add_test(NAME compile_fail.twins COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json
    -DTARGET=compile_fail_twins -DCOMPILER=${CMAKE_CXX_COMPILER} -DMODE=twin
    -P ${PROJECT_SOURCE_DIR}/cmake/FulgurCompileCheck.cmake)
  set_tests_properties(compile_fail.twins PROPERTIES LABELS compile_fail COST 30)
endfunction()
