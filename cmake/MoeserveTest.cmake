# moeserve_add_test(NAME <name> SOURCES <files...> LIBS <libs...> LABELS <unit|integration|server|multiproc|gpu|slow...>
#                   [TIMEOUT seconds])
# One helper registers every C++ test with CTest and its labels (gtest binaries; each binary is one
# CTest test so the label applies to all of its cases).
set(MOESERVE_TEST_LABELS unit integration server multiproc gpu slow)
function(moeserve_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  foreach(label IN LISTS T_LABELS)
    if(NOT label IN_LIST MOESERVE_TEST_LABELS)
      message(FATAL_ERROR "test ${T_NAME}: unknown label '${label}' (allowed: ${MOESERVE_TEST_LABELS})")
    endif()
  endforeach()
  if(NOT T_LABELS)
    message(FATAL_ERROR "test ${T_NAME}: give at least one label")
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${T_NAME} PRIVATE MOESERVE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                               MOESERVE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()

# moeserve_add_script_test(NAME <name> COMMAND <cmd...> LABELS <...>): a non-gtest test (pytest, shell).
function(moeserve_add_script_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "COMMAND;LABELS" ${ARGN})
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 900)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       ENVIRONMENT "MOESERVE_BIN=$<TARGET_FILE:moeserve>")
endfunction()
