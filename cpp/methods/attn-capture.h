#pragma once

// methods/attn-capture: attention scores from the running model, through llama.cpp's public
// hooks. The eval callback (cb_eval, set when a context is made with a Tier-2 method that needs
// scores) copies the queries of the last rows of each llama_decode call from the scored
// layers; the keys are the KV cache's own rows (llama_memory_seq_kv_read, patches/0005). The
// arithmetic (001: GQA head mapping, the model's attention scale, a stable softmax, max over
// heads, mean over queries and layers) is methods/attn-score's.
//
// Scored layers: those attending to the whole context (not sliding-window ones): a method that
// drops cells far behind changes only their view, since a sliding-window layer of Gemma 3 never
// sees more than its 512 most recent positions.
//
// Speculative prefill's scorer (001, arm_scorer): the model's own first layers score a prompt.
// Each llama_decode call keeps the keys of its tokens (Kcur after RoPE, by position) and the
// queries (Qcur) of those among the prompt's last `window` tokens in layers [0, n), and then
// cuts the graph: once the last of these tensors is computed the callback returns false, which
// makes ggml's scheduler stop computing the current split (ggml-backend.cpp,
// ggml_backend_sched_compute_splits); for any later split it asks for the first node and stops
// after it. llama_decode then returns 0 with
// meaningless logits and the call's cells allocated, their KV written up to layer n only: the
// caller removes those cells (the context stays usable: the next call builds and computes a
// whole graph again). So scoring costs about n / n_layer of a prefill.

#include "methods/attn-score.h"
#include "llama.h"

#include <cstdint>
#include <vector>

struct ggml_tensor;

// The layers attending to the whole context (not sliding-window ones), which both Tier-2 captures
// observe, and where a graph tensor named "<prefix>-<layer>" of one of them sits among them.
struct llama_opt_full_layers {
    std::vector<int32_t> layers;
    std::vector<int32_t> slot_of_layer;  // by model layer: index into layers, -1 for a sliding-window layer

    explicit llama_opt_full_layers(const llama_model * model);
    // the index into layers of tensor `name` = "<prefix>-<layer>", -1 if it is not one
    int32_t slot(const char * name, const char * prefix) const;
};

class llama_opt_attn_capture {
public:
    // `max_rows`: queries kept per call (the last rows of the ubatch).
    llama_opt_attn_capture(const llama_model * model, uint32_t max_rows);

    // The eval callback (ggml_backend_sched_eval_callback) with `this` as user data.
    static bool callback(ggml_tensor * t, bool ask, void * user_data);

    // While armed, each llama_decode call replaces the queries kept.
    void arm() { armed_ = true; n_rows_ = 0; }
    void disarm() { armed_ = false; }

    // Scorer mode (above): the keys of positions [begin, begin + n_keys) and the queries of the
    // last min(window, n_keys) of them in layers [0, n_layers), until disarm_scorer(); ahead of
    // arm()'s capture.
    void arm_scorer(uint32_t n_layers, llama_pos begin, size_t n_keys, uint32_t window);
    void disarm_scorer() { scorer_.n_layers = 0; }
    // Called before every llama_decode: the scorer's graph cut is per call.
    void new_call() { scorer_.q_seen = scorer_.k_seen = scorer_.cut = false; }
    // What the scorer kept, by layer (llama_opt_spec_importance's input); empty if it saw no
    // query of the prompt's last position (a model whose Q/K tensors are not named as expected).
    std::vector<llama_opt_spec_layer> scorer_layers() const;

    const llama_opt_attn_shape &  shape() const { return shape_; }
    const std::vector<int32_t> &  layers() const { return full_.layers; }  // the scored layers
    uint32_t                      n_rows() const { return n_rows_; }  // queries of the last call
    // The queries of scored layer i (index into layers()): n_rows() × n_head × head_dim.
    const std::vector<float> &    queries(size_t i) const { return q_[i]; }
    // Where layer i's K row starts in a position's KV rows (patches/0005's layout), and the bytes
    // of one F16 K row; 0 rows: the layout is not the one expected (scoring unavailable).
    size_t                        k_offset(size_t i) const { return k_offset_[i]; }
    size_t                        k_row_bytes() const { return k_row_bytes_; }
    size_t                        row_stride() const { return row_stride_; }  // bytes of one position's rows
    // The cache's bytes per position (llama_memory_kv_bytes_per_pos): another layout than the
    // one expected (a quantized cache, say) makes scoring unavailable.
    void                          check_layout(size_t bytes_per_pos);
    bool                          available() const { return k_row_bytes_ > 0; }

private:
    bool observe(ggml_tensor * t, bool ask);
    bool observe_scorer(ggml_tensor * t, bool ask);

    struct scorer_state {
        uint32_t                        n_layers = 0;  // 0: not scoring
        llama_pos                       begin    = 0;
        size_t                          n_keys   = 0;
        size_t                          window   = 1;   // queries kept: of positions [begin + n_keys - window, begin + n_keys)
        llama_pos                       q_pos    = -1;  // the last position whose queries were seen
        bool                            q_seen = false, k_seen = false;  // this call's, of the last layer
        bool                            cut = false;    // this call's graph is cut
        std::vector<std::vector<float>> q, k;           // by layer
    };
    scorer_state                    scorer_;

    llama_opt_attn_shape            shape_;
    llama_opt_full_layers           full_;
    std::vector<size_t>             k_offset_;
    size_t                          k_row_bytes_ = 0;
    size_t                          row_stride_  = 0;
    uint32_t                        max_rows_;
    bool                            armed_  = false;
    uint32_t                        n_rows_ = 0;
    std::vector<std::vector<float>> q_;
};

// The keys of the scored layers for some positions, as F32 (n × n_head_kv × head_dim per layer).
struct llama_opt_attn_keys {
    std::vector<llama_pos>          pos;
    std::vector<std::vector<float>> k;  // by scored layer

    // Adds positions whose KV rows (patches/0005's layout, `stride` bytes each) are in `rows`.
    void add(const llama_opt_attn_capture & capture, const llama_pos * positions, size_t n, const uint8_t * rows,
             size_t stride);
};

// The score of each key for the queries captured last, which sat at positions
// [q_end - capture.n_rows(), q_end): the mean over scored layers (llama_opt_attn_accumulate).
std::vector<float> llama_opt_attn_score(const llama_opt_attn_capture & capture, const llama_opt_attn_keys & keys,
                                        size_t q_end);
