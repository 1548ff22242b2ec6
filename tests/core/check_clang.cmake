# Compiles each of SOURCES syntax-only with CLANGXX and FLAGS (a ;-list); fails naming every file clang rejects,
# with clang's first lines for it.
set(failed)
foreach(src ${SOURCES})
  execute_process(COMMAND ${CLANGXX} ${FLAGS} -fsyntax-only ${src} RESULT_VARIABLE rc ERROR_VARIABLE err
                  OUTPUT_VARIABLE out)
  if(rc)
    string(SUBSTRING "${err}" 0 2000 head)
    message("clang++ rejected ${src}:\n${head}")
    list(APPEND failed ${src})
  endif()
endforeach()
list(LENGTH SOURCES n)
if(failed)
  message(FATAL_ERROR "clang++ -Werror failed on: ${failed}")
endif()
message(STATUS "clang++ -Wall -Wextra -Wpedantic -Werror: ${n} translation units clean")
