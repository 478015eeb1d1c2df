#pragma once

// Routing of llama.cpp/ggml log output: silent by default, everything to stderr when verbose.
// Recent warnings and errors are kept so that exceptions can say what llama.cpp reported.

#include <string>

void        llama_opt_log_init();               // installs the log callback (idempotent)
void        llama_opt_log_set_verbose(bool verbose);
bool        llama_opt_log_verbose();
std::string llama_opt_log_take_errors();        // recent warnings/errors, then forgets them
void        llama_opt_log_warn(const std::string & message);  // ours, rare (a failure we recover from): always on stderr
