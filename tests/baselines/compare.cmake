# ctest script: regenerates the run report of every shipped config into OUT and compares each
# with the committed baseline byte for byte, so any change of a shipped number fails until the
# baselines are regenerated on purpose (tools/update-baselines) and the diff reviewed.
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
file(GLOB configs RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/configs/*.json")
list(SORT configs)
execute_process(COMMAND "${MEMSIM}" check ${configs} --baseline "${OUT}/" --update-baseline
                WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "memsim check --update-baseline failed with ${rc}")
endif()
set(changed "")
foreach(config ${configs})
  get_filename_component(stem "${config}" NAME_WLE)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files
                  "${SOURCE_DIR}/tests/baselines/${stem}.json" "${OUT}/${stem}.json"
                  RESULT_VARIABLE differ)
  if(NOT differ EQUAL 0)
    list(APPEND changed "${stem}")
  endif()
endforeach()
if(changed)
  message(FATAL_ERROR "shipped numbers changed for: ${changed}\n"
          "If the change is intended, run tools/update-baselines and review the diff of tests/baselines/.")
endif()
