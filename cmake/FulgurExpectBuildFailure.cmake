# cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=... -P FulgurExpectBuildFailure.cmake
# Succeeds only when building TARGET fails with exactly one error whose output contains EXPECT.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not: the rule it checks is not enforced.")
endif()
string(FIND "${output}" "${EXPECT}" position)
if(position EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed to compile, but not with the expected message:\n  ${EXPECT}\nCompiler output:\n${output}")
endif()
# One sentence, not a cascade: exactly one error from the compiler.
string(REGEX MATCHALL "error: " errors "${output}")
list(LENGTH errors error_count)
if(NOT error_count EQUAL 1)
  message(FATAL_ERROR "${TARGET} failed with the expected message but with ${error_count} errors; a refused "
                      "combination must give exactly one.\nCompiler output:\n${output}")
endif()
message(STATUS "${TARGET} failed to compile with the expected message, and only it: ${EXPECT}")
