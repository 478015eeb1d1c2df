#include "llama-opt-log.h"

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

static void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (g_verbose) {
        fputs(text, stderr);
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    if (level != GGML_LOG_LEVEL_CONT) {
        g_partial.clear();
        g_partial_level = level;
    }
    if (g_partial_level != GGML_LOG_LEVEL_WARN && g_partial_level != GGML_LOG_LEVEL_ERROR) {
        return;
    }
    g_partial += text;
    if (!g_partial.empty() && g_partial.back() == '\n') {
        g_partial.pop_back();
        g_recent.push_back(g_partial);
        g_partial.clear();
        while (g_recent.size() > 8) {
            g_recent.pop_front();
        }
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
