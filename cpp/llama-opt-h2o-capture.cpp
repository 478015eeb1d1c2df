#include "llama-opt-h2o-capture.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-h2o.h"

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
    const int32_t slot = armed_ ? full_.slot(t->name, "kq_soft_max") : -1;
    if (slot < 0 || t->type != GGML_TYPE_F32 || t->ne[2] != n_head_ || t->ne[3] != 1 || !ggml_is_contiguous(t)) {
        return !ask;  // ask: not needed; after computing: go on
    }
    if (ask) {
        return true;
    }
    const uint32_t n_keys = (uint32_t) t->ne[0], n_query = (uint32_t) t->ne[1];
    const float *  weights = static_cast<const float *>(t->data);
    if (!t->buffer || !ggml_backend_buffer_is_host(t->buffer)) {
        weights_.resize(ggml_nelements(t));  // a device's memory: copied (on the CPU, read in place: MBs a layer)
        ggml_backend_tensor_get(t, weights_.data(), 0, ggml_nbytes(t));
        weights = weights_.data();
    }
    std::vector<float> & sums = colsum_[slot];
    sums.resize((size_t) n_head_ * n_keys);
    llama_h2o_column_sums(weights, n_head_, n_query, n_keys, sums.data());
    return true;
}
