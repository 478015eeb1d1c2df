#include "engine/op-profile.h"

#include "ggml.h"

#include <chrono>
#include <cstring>
#include <ctime>
#include <string_view>
#include <unordered_map>

static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int64_t thread_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

std::string llama_opt_profile_group_name(const char * name) {
    std::string s(name);
    if (s.rfind("blk.", 0) == 0) {  // a weight: blk.<layer>.<what>
        const size_t dot = s.find('.', 4);
        return dot == std::string::npos ? s : "blk.*" + s.substr(dot);
    }
    const size_t dash = s.rfind('-');
    if (dash != std::string::npos && dash + 1 < s.size() &&
        s.find_first_not_of("0123456789", dash + 1) == std::string::npos) {
        return s.substr(0, dash);
    }
    return s;
}

bool llama_opt_op_profile::callback(ggml_tensor * t, bool ask, void * user_data) {
    return static_cast<llama_opt_op_profile *>(user_data)->observe(t, ask);
}

void llama_opt_op_profile::reset() {
    stats_.clear();
    seen_.clear();
}

bool llama_opt_op_profile::observe(ggml_tensor * t, bool ask) {
    if (ask) {  // every node alone: its own time, its own output
        start_ns_     = now_ns();
        start_cpu_ns_ = thread_cpu_ns();
        return true;
    }
    const int64_t elapsed = now_ns() - start_ns_;
    const int64_t cpu     = thread_cpu_ns() - start_cpu_ns_;
    const bool    weighted = (t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_GET_ROWS) && t->src[0];
    const std::string op     = ggml_op_desc(t);
    const std::string name   = llama_opt_profile_group_name(t->name);
    const std::string weight = weighted ? llama_opt_profile_group_name(t->src[0]->name) : "";
    llama_opt_op_stats & s = stats_[op + "|" + name + "|" + weight];
    if (s.calls == 0) {
        s.op = op;
        s.name = name;
        s.weight = weight;
    }
    s.calls += 1;
    s.elements += (uint64_t) ggml_nelements(t);
    if (mode_ == llama_opt_profile_mode::time) {
        s.ns += (uint64_t) elapsed;
        s.cpu_ns += (uint64_t) cpu;
    } else if (mode_ == llama_opt_profile_mode::facts) {
        examine(t, s);
    }
    return true;
}

// Whether every F32 element of `t` (rows of ne[0], any strides above) equals `value` bit for bit
// up to the sign of zero.
static bool all_equal(const ggml_tensor * t, float value) {
    if (t->type != GGML_TYPE_F32 || t->nb[0] != sizeof(float) || t->data == nullptr) {
        return false;
    }
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                const float * row = (const float *) ((const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
                for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                    if (row[i0] != value) {
                        return false;
                    }
                }
            }
        }
    }
    return true;
}

void llama_opt_op_profile::examine(const ggml_tensor * t, llama_opt_op_stats & s) {
    if (ggml_nelements(t) == 0) {
        return;  // e.g. the last layer's rows of a ubatch that needs no logits: nothing to be zero or identity
    }
    if (t->op == GGML_OP_ADD && (all_equal(t->src[0], 0.0f) || all_equal(t->src[1], 0.0f))) {
        s.identity_calls += 1;
    }
    if (t->op == GGML_OP_MUL && (all_equal(t->src[0], 1.0f) || all_equal(t->src[1], 1.0f))) {
        s.identity_calls += 1;
    }
    if (t->type != GGML_TYPE_F32 || t->nb[0] != sizeof(float) || t->data == nullptr || t->ne[0] == 0) {
        return;
    }
    const size_t row_bytes = (size_t) t->ne[0] * sizeof(float);
    std::unordered_set<uint64_t> & seen = seen_[t->name];
    std::unordered_map<uint64_t, const char *> in_output;  // first row of each hash in this output
    std::unordered_set<uint64_t> new_rows;
    bool all_zero = true;
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                const char *  bytes = (const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                const float * row   = (const float *) bytes;
                s.rows += 1;
                const uint64_t h = std::hash<std::string_view>{}(std::string_view(bytes, row_bytes));
                auto first = in_output.find(h);
                if (first == in_output.end()) {
                    in_output.emplace(h, bytes);
                } else if (std::memcmp(first->second, bytes, row_bytes) == 0) {
                    s.rows_dup += 1;
                }
                if (seen.count(h)) {
                    s.rows_seen += 1;
                }
                new_rows.insert(h);
                bool zero = true;
                bool one  = false;
                for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                    zero = zero && row[i0] == 0.0f;
                    one  = one || row[i0] == 1.0f;
                }
                s.rows_zero += zero;
                all_zero = all_zero && zero;
                if (t->op == GGML_OP_SOFT_MAX && one) {
                    s.onehot_rows += 1;
                }
            }
        }
    }
    s.outputs_zero += all_zero;
    seen.insert(new_rows.begin(), new_rows.end());  // after the loop: "seen" means in an earlier graph
}
