# Obtain the pinned, patched llama.cpp tree (tools/fetch_llama.py) and add its libraries.
# Nothing of upstream is committed; see vendor/llama.cpp/PIN and patches/README.md.
include(${CMAKE_CURRENT_LIST_DIR}/llama-fetch.cmake)
llama_opt_fetch_llama_tree(LLAMA_CPP_TREE ${PROJECT_SOURCE_DIR}/tools/fetch_llama.py)
message(STATUS "pyllamaopt: llama.cpp tree ${LLAMA_CPP_TREE}")

# Reconfigure when the pin or a patch changes.
file(GLOB LLAMA_OPT_PATCHES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/patches/*.patch)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/vendor/llama.cpp/PIN ${LLAMA_OPT_PATCHES})

function(llama_opt_pin_value key out)
    file(STRINGS ${PROJECT_SOURCE_DIR}/vendor/llama.cpp/PIN line REGEX "^${key} *=")
    string(REGEX REPLACE "^${key} *= *" "" value "${line}")
    set(${out} "${value}" PARENT_SCOPE)
endfunction()
llama_opt_pin_value(upstream_build LLAMA_BUILD_NUMBER)
llama_opt_pin_value(upstream_commit LLAMA_BUILD_COMMIT)

# Only the libraries, statically, into our one extension module.
set(BUILD_SHARED_LIBS     OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_COMMON    OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_TESTS     OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_TOOLS     OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_EXAMPLES  OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_SERVER    OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_APP       OFF CACHE BOOL "" FORCE)
set(LLAMA_CURL            OFF CACHE BOOL "" FORCE)
set(LLAMA_OPENSSL         OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_TESTS      OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES   OFF CACHE BOOL "" FORCE)
include(${CMAKE_CURRENT_LIST_DIR}/llama-cpu-flags.cmake)
add_subdirectory(${LLAMA_CPP_TREE} llama.cpp EXCLUDE_FROM_ALL)
llama_opt_apply_no_amx()
