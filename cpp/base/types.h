#pragma once

// base/types: the types every module of the optimization layer shares (token ids, errors).
// Plain C++17 with no dependency on llama.cpp.

#include <cstdint>
#include <stdexcept>
#include <string>

typedef int32_t llama_token;  // same typedef as llama.h (a redeclaration is legal C++)
typedef int32_t llama_pos;

// What went wrong, so that the Python layer can raise a specific exception type.
enum class llama_opt_errc {
    config,               // malformed LLAMA_OPT_* value or option
    feature_unavailable,  // asked for a feature that this build compiled out
    model_load,           // missing, unreadable or invalid model file
    invalid_token,        // token id outside the vocabulary
    context_overflow,     // history would not fit the context
    session_closed,       // use of a closed session
    session_evicted,      // use of a session whose KV was evicted to make room
    decode_failed,        // llama_decode failed for another reason
    invalid_argument,     // any other bad argument
    grammar,              // invalid grammar
    chat_template,        // a chat template that does not parse or render, a reply it cannot parse
};

struct llama_opt_error : std::runtime_error {
    llama_opt_errc code;
    std::string    variable;  // the LLAMA_OPT_* variable or option at fault, if any

    llama_opt_error(llama_opt_errc code, const std::string & message, std::string variable = "")
        : std::runtime_error(message), code(code), variable(std::move(variable)) {}
};
