#include "methods/h2o-capture.h"

#include "ggml-backend.h"
#include "ggml.h"

llama_opt_h2o_capture::llama_opt_h2o_capture(const llama_model * model)
    : full_(model), n_head_((uint32_t) llama_model_n_head(model)) {
    colsum_.resize(full_.layers.size());
}

void llama_opt_h2o_capture::arm() {
    armed_ = true;
    for (auto & c : colsum_) {
        c.clear();
    }
}

bool llama_opt_h2o_capture::callback(ggml_tensor * t, bool ask, void * user_data) {
    return static_cast<llama_opt_h2o_capture *>(user_data)->observe(t, ask);
}

bool llama_opt_h2o_capture::observe(ggml_tensor * t, bool ask) {
    const int32_t slot = armed_ ? full_.slot(t->name, "kq_colsum") : -1;
    if (slot < 0 || t->type != GGML_TYPE_F32 || t->ne[1] != 1 || t->ne[2] != n_head_ || t->ne[3] != 1 ||
        !ggml_is_contiguous(t)) {
        return !ask;  // ask: not needed; after computing: go on
    }
    if (ask) {
        return true;
    }
    std::vector<float> & sums = colsum_[slot];
    sums.resize((size_t) n_head_ * t->ne[0]);  // head by head, key by key: the tensor's own order
    ggml_backend_tensor_get(t, sums.data(), 0, ggml_nbytes(t));
    return true;
}

llama_h2o_params llama_opt_h2o_params(const llama_opt_config & cfg) {
    llama_h2o_params p;
    p.local_window = cfg.h2o_local_window, p.heavy_budget = cfg.h2o_heavy_budget, p.chunk_size = cfg.h2o_chunk_size;
    return p;
}

void llama_opt_h2o_check_settings(const llama_opt_config & cfg, const llama_opt_h2o_capture & capture, uint32_t n_batch,
                                  bool flash_attn, bool attn_captured) {
    const llama_h2o_params p   = llama_opt_h2o_params(cfg);
    const std::string      why = llama_h2o_check_params(p);
    if (!why.empty()) {
        throw llama_opt_error(llama_opt_errc::config, why, "h2o_chunk_size");
    }
    if (p.chunk_size > n_batch) {
        throw llama_opt_error(llama_opt_errc::config,
            "h2o_chunk_size (" + std::to_string(p.chunk_size) + ") must fit one llama_decode call of this context (" +
            std::to_string(n_batch) + " tokens): raise n_batch or lower LLAMA_OPT_H2O_CHUNK_SIZE", "h2o_chunk_size");
    }
    if (attn_captured) {
        throw llama_opt_error(llama_opt_errc::config,
            std::string("h2o_enabled and ") + (cfg.attn_prune_enabled ? "attn_prune_enabled" : "spec_prefill_enabled") +
            " cannot share a context yet (both observe the graph): turn one off", "h2o_enabled");
    }
    if (!flash_attn) {
        throw llama_opt_error(llama_opt_errc::config,
            "H2O gathers K and V rows from the cache, which needs flash_attn=True (without it llama.cpp stores V "
            "transposed)", "flash_attn");
    }
    if (capture.layers().empty()) {
        throw llama_opt_error(llama_opt_errc::config,
            "this model has no full-attention layer (every layer slides): H2O has nothing to do; turn h2o_enabled off",
            "h2o_enabled");
    }
}
