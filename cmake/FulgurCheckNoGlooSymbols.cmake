# cmake -DNM=... -DOBJECTS="a.o;b.o" -P FulgurCheckNoGlooSymbols.cmake
# fulgur's gloo declarations (src/distributed/gloo_declarations) must never define code or data:
# any defined symbol that names gloo, or ProcessGroupGloo's inline GlooStore, could clash with
# LibTorch's own at run time.
set(found "")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols ERROR_QUIET)
  string(REGEX MATCHALL "[^\n]*(gloo::|GlooStore)[^\n]*" hits "${symbols}")
  foreach(hit IN LISTS hits)
    # A standard template over a gloo type (std::vector<std::shared_ptr<gloo::transport::Device>>),
    # emitted weak where it was not inlined (the -O1 sanitizer builds): LibTorch's copy is the same
    # code, and it defines nothing of gloo's.
    if(hit MATCHES " [WV] ([^ ]+ )?std::[A-Za-z_:]+<" AND NOT hit MATCHES "GlooStore")
      continue()
    endif()
    list(APPEND found "${hit}")
  endforeach()
endforeach()
if(found)
  string(REPLACE ";" "\n" found "${found}")
  message(FATAL_ERROR "fulgur's objects define gloo symbols:\n${found}")
endif()
message(STATUS "no gloo symbol is defined by fulgur's objects")
