# The online example killed half-way and restarted ends bit for bit where an uninterrupted run
# ends: the same final files (model, AdamW's state, the solver, the replay buffer, the counters),
# byte for byte, and the same rollout error and loss (the "fingerprint" line, in hexadecimal).
#   cmake -DONLINE=<online> -DDIR=<scratch directory> -P restart_test.cmake
cmake_minimum_required(VERSION 3.20)
set(args --quick --checkpoint-every 500)
file(REMOVE_RECURSE "${DIR}")

function(run_online out_var expect)
  execute_process(COMMAND "${ONLINE}" ${args} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc MATCHES "${expect}")
    message(FATAL_ERROR "online ${ARGN}: expected an exit matching '${expect}', found '${rc}'\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(fingerprint text var)
  if(NOT text MATCHES "fingerprint ([^\n]+)")
    message(FATAL_ERROR "no fingerprint line in:\n${text}")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# 1. Uninterrupted.
run_online(whole "^0$" --out "${DIR}/whole")
fingerprint("${whole}" whole_print)

# 2. Killed at solver step 1234 (SIGKILL: nothing flushed, nothing cleaned up), 234 steps after
#    its last complete set of files, then restarted from them.
run_online(killed "[Kk]illed" --out "${DIR}/killed" --kill-at 1234)
if(NOT killed MATCHES "killed at solver step 1234")
  message(FATAL_ERROR "the run was not killed where asked:\n${killed}")
endif()
file(READ "${DIR}/killed/online.state.safetensors" state OFFSET 8 LIMIT 2048)  # (the JSON header)
if(NOT state MATCHES "step-1000.model.safetensors")
  message(FATAL_ERROR "the killed run's state file does not name step 1000's files")
endif()
run_online(restarted "^0$" --out "${DIR}/killed" --restart)
if(NOT restarted MATCHES "restarted from [^\n]* at solver step 1000")
  message(FATAL_ERROR "the restart did not begin at solver step 1000:\n${restarted}")
endif()
fingerprint("${restarted}" restarted_print)
if(NOT whole_print STREQUAL restarted_print)
  message(FATAL_ERROR "rollout error and loss differ: uninterrupted ${whole_print}, restarted ${restarted_print}")
endif()

# 3. The same files, byte for byte; the earlier sets removed once a later one was whole.
foreach(f online.state.safetensors step-3000.model.safetensors step-3000.adamw.safetensors)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${DIR}/whole/${f}" "${DIR}/killed/${f}"
                  RESULT_VARIABLE differ)
  if(differ)
    message(FATAL_ERROR "${f} differs between the uninterrupted and the restarted run")
  endif()
endforeach()
file(GLOB left RELATIVE "${DIR}/killed" "${DIR}/killed/*")
list(SORT left)
if(NOT left STREQUAL "online.state.safetensors;step-3000.adamw.safetensors;step-3000.model.safetensors")
  message(FATAL_ERROR "expected the last set of files only, found: ${left}")
endif()

# 4. A restart from another run's files is refused, and changes nothing.
run_online(other "^1$" --out "${DIR}/killed" --restart --seed 2)
file(SHA256 "${DIR}/killed/online.state.safetensors" after)
file(SHA256 "${DIR}/whole/online.state.safetensors" before)
if(NOT after STREQUAL before)
  message(FATAL_ERROR "a refused restart changed the state file")
endif()
message(STATUS "restarted run equals the uninterrupted one: fingerprint ${whole_print}")
