#include "llama-opt-h2o-capture.h"

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
