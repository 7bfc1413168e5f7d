# cmake -DCOMMANDS=compile_commands.json -DTARGET=name -DCOMPILER=c++ -DMODE=fail|twin|pch
#       [-DCLANG=ON] [-DEXPECT=text] [-DPCH=file] -P FulgurCompileCheck.cmake
# (CLANG=ON: the command is a g++ build's, run under clang.)
# Compiles TARGET's source with -fsyntax-only, using the flags CMake gave the build, read from
# compile_commands.json: fail: there must be exactly one error, containing EXPECT; twin: none.
# Syntax only, because what a case checks is decided before code generation (both compilers
# instantiate every template the source uses); straight from the compile command, not through the
# build tool, so the cases run side by side rather than one at a time under the build tree's lock.
# Under g++ the command's precompiled header (the unit tests') is used as it is. clang cannot read
# it: mode pch makes clang's own from the same header and flags (once, a ctest fixture), and fail
# and twin use it where the command includes the header; clang's own warnings are the clang
# build's business (scripts/check.sh clang), so -Werror goes.
file(READ "${COMMANDS}" json)
string(JSON count LENGTH "${json}")
math(EXPR last "${count} - 1")
set(command "")
foreach(i RANGE ${last})
  string(JSON entry GET "${json}" ${i} command)
  if(entry MATCHES "CMakeFiles/${TARGET}\\.dir/")  # the object file's path names the target
    set(command "${entry}")
    string(JSON directory GET "${json}" ${i} directory)
    break()
  endif()
endforeach()
if(command STREQUAL "")
  message(FATAL_ERROR "no compile command for ${TARGET} in ${COMMANDS}")
endif()
separate_arguments(words UNIX_COMMAND "${command}")
# Drop the launcher and compiler (everything before the first flag), the output and -c.
set(args "")
set(skip_next FALSE)
set(seen_flag FALSE)
set(include_next FALSE)
set(pch_header "")
foreach(word IN LISTS words)
  if(skip_next)
    set(skip_next FALSE)
  elseif(NOT seen_flag AND NOT word MATCHES "^-")
    # the launcher (ccache) and the compiler
  elseif(word STREQUAL "-o" OR word STREQUAL "-MF" OR word STREQUAL "-MT")
    set(skip_next TRUE)
    set(seen_flag TRUE)
  elseif(CLANG AND word STREQUAL "-include")
    set(include_next TRUE)
    set(seen_flag TRUE)
  elseif(include_next)
    set(include_next FALSE)
    if(word MATCHES "cmake_pch\\.hxx$")
      set(pch_header "${word}")
    else()
      list(APPEND args -include "${word}")
    endif()
  elseif(MODE STREQUAL "pch" AND word MATCHES "^-DFULGUR_(COMPILE_FAIL|RULE_)|\\.cpp$")
    # the case's own macros and source: the header is made once for all cases
  elseif(word STREQUAL "-c" OR word MATCHES "^-MD$|^-MMD$")
    set(seen_flag TRUE)
  elseif(CLANG AND word MATCHES "^-Wno-stringop-overread$|^-Winvalid-pch$|^-Werror$")
    set(seen_flag TRUE)
  else()
    set(seen_flag TRUE)
    list(APPEND args "${word}")
  endif()
endforeach()
if(CLANG)
  list(PREPEND args -Wno-unknown-warning-option)
endif()
if(MODE STREQUAL "pch")
  if(NOT pch_header)  # a build without precompiled headers (CMAKE_DISABLE_PRECOMPILE_HEADERS)
    message(STATUS "${TARGET} is compiled without a precompiled header: clang needs none either")
    return()
  endif()
  # -fpch-instantiate-templates: the headers' pending template instantiations are done once, in the
  # header, not again in every case (CMake's PCH_INSTANTIATE_TEMPLATES does the same for its own clang
  # headers): a case takes ~2.5 s instead of ~10.
  execute_process(COMMAND "${COMPILER}" -x c++-header -fpch-instantiate-templates ${args} "${pch_header}" -o "${PCH}"
    WORKING_DIRECTORY "${directory}" RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${COMPILER} could not precompile ${pch_header}:\n${output}")
  endif()
  message(STATUS "${COMPILER} precompiled ${pch_header} into ${PCH}")
  return()
endif()
if(pch_header)
  list(PREPEND args -include-pch "${PCH}")
endif()
execute_process(COMMAND "${COMPILER}" -fsyntax-only ${args}
  WORKING_DIRECTORY "${directory}" RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
string(REGEX MATCHALL "error: " errors "${output}")
list(LENGTH errors error_count)
if(MODE STREQUAL "twin")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${TARGET} (the compiling twin) fails under ${COMPILER}:\n${output}")
  endif()
  message(STATUS "${TARGET} compiles under ${COMPILER}")
  return()
endif()
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled under ${COMPILER}, but it must not: the rule it checks is not enforced.")
endif()
string(FIND "${output}" "${EXPECT}" position)
if(position EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed under ${COMPILER}, but not with the expected message:\n  ${EXPECT}\n${output}")
endif()
# One sentence, not a cascade: exactly one error from the compiler.
if(NOT error_count EQUAL 1)
  message(FATAL_ERROR "${TARGET} failed under ${COMPILER} with the expected message but with ${error_count} errors; "
                      "a refused combination must give exactly one.\n${output}")
endif()
message(STATUS "${TARGET} failed under ${COMPILER} with the expected message, and only it: ${EXPECT}")
