#pragma once

// Minimal checks for the C++ unit tests: report every failure, exit non-zero if any.

#include <cstdio>
#include <cstdlib>

static int g_failures = 0;

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                          \
        }                                                                          \
    } while (0)

// Runs `stmt` and checks that it throws llama_opt_error with the given code.
#define CHECK_THROWS(stmt, errc)                     \
    do {                                             \
        bool thrown_ = false;                        \
        try {                                        \
            stmt;                                    \
        } catch (const llama_opt_error & e) {        \
            thrown_ = e.code == (errc);              \
        }                                            \
        CHECK(thrown_ && #stmt);                     \
    } while (0)

static int check_result(const char * name) {
    if (g_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}
