# llama_opt_fetch_llama_tree(<out-var> <fetch-script>): run the fetch script (tools/fetch_llama.py)
# and set <out-var> to the llama.cpp tree it prepared. The script's stdout must be exactly the
# tree's path (its progress goes to stderr); anything else stops the configure step here, with
# what was printed, instead of failing later in add_subdirectory.
function(llama_opt_fetch_llama_tree out fetch_script)
    execute_process(
        COMMAND ${Python_EXECUTABLE} ${fetch_script}
        RESULT_VARIABLE fetch_result
        OUTPUT_VARIABLE tree
        OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT fetch_result EQUAL 0)
        message(FATAL_ERROR "Could not prepare the pinned llama.cpp source (see the error above).")
    endif()
    if(NOT IS_DIRECTORY "${tree}" OR NOT EXISTS "${tree}/CMakeLists.txt")
        message(FATAL_ERROR
            "${fetch_script} should print only the path of the llama.cpp tree it prepared, "
            "but its output is not a llama.cpp tree:\n${tree}\n"
            "This is a bug in pyllamaopt's build; set LLAMA_CPP_SOURCE_DIR to a pristine "
            "llama.cpp tree to work around it.")
    endif()
    set(${out} "${tree}" PARENT_SCOPE)
endfunction()
