#include "engine/log.h"

#include "llama.h"

#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>

static std::atomic<bool>        g_verbose{ false };
static std::mutex               g_mutex;
static std::deque<std::string>  g_recent;   // complete lines at WARN/ERROR level
static std::string              g_partial;  // ggml logs a line in pieces (CONT)
static ggml_log_level           g_partial_level = GGML_LOG_LEVEL_NONE;

static void remember(const std::string & line) {  // (g_mutex held)
    g_recent.push_back(line);
    while (g_recent.size() > 8) {
        g_recent.pop_front();
    }
}

static void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (g_verbose) {
        fputs(text, stderr);
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    if (level != GGML_LOG_LEVEL_CONT) {
        if (!g_partial.empty()) {  // a warning or error whose line was never ended (llama.cpp has a few)
            remember(g_partial);
        }
        g_partial.clear();
        g_partial_level = level;
    }
    if (g_partial_level != GGML_LOG_LEVEL_WARN && g_partial_level != GGML_LOG_LEVEL_ERROR) {
        return;
    }
    g_partial += text;
    if (!g_partial.empty() && g_partial.back() == '\n') {
        g_partial.pop_back();
        remember(g_partial);
        g_partial.clear();
    }
}

void llama_opt_log_init() {
    static std::once_flag once;
    std::call_once(once, [] { llama_log_set(log_callback, nullptr); });
}

void llama_opt_log_set_verbose(bool verbose) {
    g_verbose = verbose;
}

bool llama_opt_log_verbose() {
    return g_verbose;
}

std::string llama_opt_log_take_errors() {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_partial.empty()) {  // a line not ended yet
        remember(g_partial);
        g_partial.clear();
    }
    std::string out;
    for (const auto & line : g_recent) {
        out += (out.empty() ? "" : "\n") + line;
    }
    g_recent.clear();
    return out;
}

void llama_opt_log_warn(const std::string & message) {
    fprintf(stderr, "%s\n", message.c_str());
}
