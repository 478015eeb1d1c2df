# llama.cpp's `common` library as the chat layer needs it (common/chat: templates through its
# jinja engine, the tool-call parsers, JSON Schema to grammar), built from the pinned tree as the
# static library `llama-opt-common`. Left out: what only its programs use (argument parsing,
# downloads and the HTTP client, console, presets, subprocesses): no network code is linked.
# The list follows the pin's common/CMakeLists.txt; a source it adds that these need fails the link.
find_package(Threads REQUIRED)
set(_common ${LLAMA_CPP_TREE}/common)
include(${_common}/parsers/sources.cmake)  # LLAMA_CHAT_PARSERS_SOURCES

# common/build-info.cpp.in, filled from the pin (the tree has no .git to read it from)
set(BUILD_COMPILER "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
set(BUILD_TARGET "${CMAKE_SYSTEM_PROCESSOR}")
configure_file(${_common}/build-info.cpp.in ${CMAKE_CURRENT_BINARY_DIR}/llama-common-build-info.cpp)

add_library(llama-opt-common STATIC
    ${LLAMA_CHAT_PARSERS_SOURCES}
    ${CMAKE_CURRENT_BINARY_DIR}/llama-common-build-info.cpp
    ${_common}/chat.cpp
    ${_common}/chat-auto-parser-generator.cpp
    ${_common}/chat-auto-parser-helpers.cpp
    ${_common}/chat-diff-analyzer.cpp
    ${_common}/chat-peg-parser.cpp
    ${_common}/peg-parser.cpp
    ${_common}/json.cpp
    ${_common}/json-schema.cpp
    ${_common}/json-schema-to-grammar.cpp
    ${_common}/jinja/lexer.cpp
    ${_common}/jinja/parser.cpp
    ${_common}/jinja/runtime.cpp
    ${_common}/jinja/value.cpp
    ${_common}/jinja/string.cpp
    ${_common}/jinja/caps.cpp
    ${_common}/unicode.cpp
    ${_common}/trie.cpp
    ${_common}/log.cpp
    # common.cpp (string helpers the chat layer calls) and what it links to
    ${_common}/common.cpp
    ${_common}/sampling.cpp
    ${_common}/speculative.cpp
    ${_common}/reasoning-budget.cpp
    ${_common}/fit.cpp
    ${_common}/ngram-cache.cpp
    ${_common}/ngram-map.cpp
    ${_common}/ngram-mod.cpp
    ${_common}/llguidance.cpp)
target_include_directories(llama-opt-common PUBLIC ${_common})
target_link_libraries(llama-opt-common PUBLIC llama vendor::nlohmann vendor::sheredom Threads::Threads)
target_compile_features(llama-opt-common PUBLIC cxx_std_17)
