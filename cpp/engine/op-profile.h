#pragma once

// engine/op-profile: where the time of a forward pass goes, from ggml's own graph, and the
// facts that bound the Phase-5 ideas of the specification (000 §2.2, §5). A diagnostic, not an
// optimization: a context made with a profile mode installs it as llama.cpp's eval callback
// (cb_eval), so it sees every node of every graph that context computes.
//
// mode time: every node is computed as a graph of its own and timed: wall clock, and the CPU time
//   of the thread that calls llama_decode (with one compute thread, ggml computes every node in
//   it, so that time is the node's work without the preemptions of a loaded machine).
//   That costs a thread-pool round trip per node (measured by the views, reshapes and permutes,
//   which compute nothing) and disables ggml's CPU fusion of RMS_NORM + MUL, so norms are timed
//   unfused: an upper bound of their share.
// mode facts: after each node is computed, its F32 output rows are examined: rows equal bit for
//   bit to another row of the same output (work a row-level CSE could skip), rows seen before
//   under the same node name in any earlier graph (a cache keyed by the input, e.g. the norm
//   statistics, could hit only on those), all-zero rows and outputs, ADD/MUL operands that are
//   exact identities, one-hot softmax rows. Slow: for measurement only.

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

struct ggml_tensor;

enum class llama_opt_profile_mode { none, time, facts };

// One group of nodes: same operation, same name once the layer number is taken out.
struct llama_opt_op_stats {
    std::string op;      // ggml's operation ("MUL_MAT", "RMS_NORM", ...)
    std::string name;    // the node's name with "-<layer>" removed ("attn_norm", "Qcur", ...)
    std::string weight;  // MUL_MAT / GET_ROWS: the weight's name with the layer as '*' ("blk.*.attn_q.weight")
    uint64_t    calls    = 0;
    uint64_t    elements = 0;  // output elements, summed over calls
    uint64_t    ns       = 0;  // time mode: wall time, summed over calls
    uint64_t    cpu_ns   = 0;  // time mode: CPU time of the calling thread, summed over calls

    // facts mode (F32 outputs only)
    uint64_t rows           = 0;  // output rows examined
    uint64_t rows_dup       = 0;  // equal bit for bit to an earlier row of the same output
    uint64_t rows_seen      = 0;  // equal (64-bit hash) to a row this node (same layer) output in an earlier graph
    uint64_t rows_zero      = 0;  // every element +0 or -0
    uint64_t outputs_zero   = 0;  // calls whose whole output was zero
    uint64_t identity_calls = 0;  // ADD with an all-zero operand, MUL with an all-one operand
    uint64_t onehot_rows    = 0;  // SOFT_MAX rows holding an exact 1.0
};

class llama_opt_op_profile {
public:
    explicit llama_opt_op_profile(llama_opt_profile_mode mode) : mode_(mode) {}

    // The eval callback (ggml_backend_sched_eval_callback) with `this` as user data.
    static bool callback(ggml_tensor * t, bool ask, void * user_data);

    llama_opt_profile_mode mode() const { return mode_; }
    const std::map<std::string, llama_opt_op_stats> & stats() const { return stats_; }
    void reset();

private:
    bool observe(ggml_tensor * t, bool ask);
    void examine(const ggml_tensor * t, llama_opt_op_stats & s);

    llama_opt_profile_mode                    mode_;
    std::map<std::string, llama_opt_op_stats> stats_;
    int64_t                                   start_ns_     = 0;
    int64_t                                   start_cpu_ns_ = 0;
    // rows output before, by node name (with its layer): what a cache keyed by them could hit
    std::unordered_map<std::string, std::unordered_set<uint64_t>> seen_;
};

// "attn_norm-12" -> "attn_norm"; "blk.12.attn_q.weight" -> "blk.*.attn_q.weight" (for grouping).
std::string llama_opt_profile_group_name(const char * name);
