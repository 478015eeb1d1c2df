#pragma once

// methods/h2o-capture: the column sums of H2O chunks (docs/h2o.md). During a chunk computed with
// attention subsets (patches/0010), the graph sums each full-attention layer's softmax weights over
// the chunk's queries into "kq_colsum-<il>" ([n_keys, 1, n_head]); the eval callback keeps them,
// n_head x n_keys per layer. Also what H2O asks of the context that observes them
// (llama_opt_h2o_check_settings), checked when the context chooses its eval callback.

#include "methods/h2o.h"
#include "methods/attn-capture.h"
#include "base/config.h"
#include "base/types.h"
#include "llama.h"

#include <cstdint>
#include <vector>

struct ggml_tensor;

class llama_opt_h2o_capture {
public:
    explicit llama_opt_h2o_capture(const llama_model * model);

    // The eval callback (ggml_backend_sched_eval_callback) with `this` as user data.
    static bool callback(ggml_tensor * t, bool ask, void * user_data);

    // While armed, each llama_decode call replaces the column sums kept.
    void arm();
    void disarm() { armed_ = false; }

    const std::vector<int32_t> & layers() const { return full_.layers; }  // the full-attention (H2O) layers
    uint32_t                     n_head() const { return n_head_; }
    // Column sums of H2O layer i (index into layers()) in the last call: n_head x n_keys; empty if
    // the layer's weights were not seen.
    const std::vector<float> &   colsum(size_t i) const { return colsum_[i]; }

private:
    bool observe(ggml_tensor * t, bool ask);

    llama_opt_full_layers           full_;
    uint32_t                        n_head_ = 0;
    bool                            armed_  = false;
    std::vector<std::vector<float>> colsum_;
};

// H2O's parameters as configured (h2o_local_window, h2o_heavy_budget, h2o_chunk_size).
llama_h2o_params llama_opt_h2o_params(const llama_opt_config & cfg);

// llama_opt_error(config) if H2O cannot work in a context whose llama_decode calls take n_batch
// tokens: parameters out of range, a chunk larger than a call, another observer of the graph
// (`attn_captured`: attn_prune_enabled or spec_prefill_enabled), flash attention off (rows are
// gathered from the cache), or a model without a full-attention layer.
void llama_opt_h2o_check_settings(const llama_opt_config & cfg, const llama_opt_h2o_capture & capture, uint32_t n_batch,
                                  bool flash_attn, bool attn_captured);
