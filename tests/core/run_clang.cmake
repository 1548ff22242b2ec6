# Compiles SOURCES (a ;-list forming one program) with CLANGXX and FLAGS into OUT and runs it: code generation,
# which -fsyntax-only does not reach, is where clang checks that target-specific intrinsics are only inlined into
# functions compiled for their ISA.
execute_process(COMMAND ${CLANGXX} ${FLAGS} ${SOURCES} -o ${OUT} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  string(SUBSTRING "${err}" 0 3000 head)
  message(FATAL_ERROR "clang++ failed to build ${OUT}:\n${head}")
endif()
execute_process(COMMAND ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(rc)
  message(FATAL_ERROR "${OUT} (built by clang++) failed")
endif()
