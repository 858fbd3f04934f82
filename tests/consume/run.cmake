# Runs one consumer project (tests/consume/<MODE>) against kiln: configure, build, run.
# Invoked by ctest as: cmake -DMODE=... -DKILN_SOURCE_DIR=... -DKILN_BINARY_DIR=...
#                            -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P run.cmake
cmake_minimum_required(VERSION 3.25)

foreach(var MODE KILN_SOURCE_DIR KILN_BINARY_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consume/${MODE}: ${what} failed (${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(consumer_args "")
if(MODE STREQUAL "find_package")
  # Install kiln from the enclosing build tree into a private prefix; the consumer must find
  # it there and only there.
  set(prefix ${WORK_DIR}/prefix)
  run_step("cmake --install" ${CMAKE_COMMAND} --install ${KILN_BINARY_DIR} --prefix ${prefix})
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${prefix} -DKILN_EXPECTED_PREFIX=${prefix})
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND consumer_args -DKILN_SOURCE_DIR=${KILN_SOURCE_DIR})
else()
  message(FATAL_ERROR "run.cmake: unknown MODE ${MODE}")
endif()

# No build type (no optimisation): the consumers check packaging, and kiln's headers take
# twice as long to compile with optimisation.
run_step("configure" ${CMAKE_COMMAND}
  -S ${KILN_SOURCE_DIR}/tests/consume/${MODE} -B ${WORK_DIR}/build
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
  ${consumer_args})
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run" ${WORK_DIR}/build/consumer)
if(MODE STREQUAL "find_package")
  run_step("run compiled" ${WORK_DIR}/build/consumer_compiled)
endif()
