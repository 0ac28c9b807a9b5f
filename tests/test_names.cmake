# ctest check that every Catch2 test case of memsim_tests runs under ctest as its own test.
# catch_discover_tests (Catch2 v2's CatchAddTests.cmake) reads `--list-test-names-only` into a
# CMake list, so a ';' in a name splits it into two ctest tests whose specs match nothing, and
# Catch2 passes a spec that matches nothing ("No tests ran", exit 0): the test never runs. A name
# that starts with '-' is read as an option. Usage: cmake -DTESTS=<memsim_tests> -P test_names.cmake
# (Catch2 v2 exits with the number of tests it lists, so only the output is checked.)
execute_process(COMMAND "${TESTS}" --list-test-names-only OUTPUT_VARIABLE names)
if(NOT names MATCHES "[a-z]")
  message(FATAL_ERROR "${TESTS} --list-test-names-only listed no test")
endif()
string(REGEX MATCHALL "[^\n]*;[^\n]*" with_semicolon "${names}")
string(REGEX MATCHALL "(^|\n)-[^\n]*" with_dash "${names}")
if(with_semicolon OR with_dash)
  string(REPLACE ";" "\\;" with_semicolon "${with_semicolon}")
  message(FATAL_ERROR "test names ctest cannot run (no ';' in a name, none starting with '-'):\n"
                      "${with_semicolon}\n${with_dash}")
endif()
