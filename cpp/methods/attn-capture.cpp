#include "methods/attn-capture.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-model.h"  // llama.cpp's internal hyperparameters (src/): which layers slide, the attention scale

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

llama_opt_full_layers::llama_opt_full_layers(const llama_model * model) {
    const int32_t n_layer = llama_model_n_layer(model);
    slot_of_layer.assign(n_layer, -1);
    for (int32_t il = 0; il < n_layer; ++il) {
        if (!model->hparams.is_swa(il)) {
            slot_of_layer[il] = (int32_t) layers.size();
            layers.push_back(il);
        }
    }
}

int32_t llama_opt_full_layers::slot(const char * name, const char * prefix) const {
    const size_t n     = std::strlen(prefix);
    int          layer = -1;
    if (std::strncmp(name, prefix, n) != 0 || name[n] != '-' || std::sscanf(name + n + 1, "%d", &layer) != 1 ||
        layer < 0 || layer >= (int) slot_of_layer.size()) {
        return -1;
    }
    return slot_of_layer[layer];
}

llama_opt_attn_capture::llama_opt_attn_capture(const llama_model * model, uint32_t max_rows)
    : full_(model), max_rows_(max_rows) {
    const llama_hparams & hp = model->hparams;
    const int32_t n_layer = llama_model_n_layer(model);
    shape_.n_head    = (uint32_t) llama_model_n_head(model);
    shape_.n_head_kv = (uint32_t) llama_model_n_head_kv(model);
    shape_.head_dim  = hp.n_embd_head_k();
    shape_.scale     = hp.f_attention_scale != 0.0f ? hp.f_attention_scale : 1.0f / std::sqrt((float) shape_.head_dim);
    q_.resize(full_.layers.size());
    // patches/0005: per position, the layers of the full-attention cache (or the only one) in
    // order, K row then V row (F16), then those of the sliding-window cache
    if (!hp.is_n_embd_k_gqa_variable() && shape_.n_head_kv > 0 && shape_.n_head % shape_.n_head_kv == 0 &&
        hp.n_embd_k_gqa() == shape_.n_head_kv * shape_.head_dim) {
        k_row_bytes_ = hp.n_embd_k_gqa() * sizeof(ggml_fp16_t);
        const size_t layer_bytes = k_row_bytes_ + hp.n_embd_v_gqa() * sizeof(ggml_fp16_t);
        for (size_t i = 0; i < full_.layers.size(); ++i) {
            k_offset_.push_back(i * layer_bytes);
        }
        row_stride_ = (size_t) n_layer * layer_bytes;
    }
}

void llama_opt_attn_capture::check_layout(size_t bytes_per_pos) {
    if (bytes_per_pos != row_stride_) {
        k_row_bytes_ = 0;
    }
}

bool llama_opt_attn_capture::callback(ggml_tensor * t, bool ask, void * user_data) {
    return static_cast<llama_opt_attn_capture *>(user_data)->observe(t, ask);
}

void llama_opt_attn_capture::arm_scorer(uint32_t n_layers, llama_pos begin, size_t n_keys, uint32_t window) {
    scorer_.n_layers = std::min<uint32_t>(n_layers, (uint32_t) full_.slot_of_layer.size());
    scorer_.begin    = begin;
    scorer_.n_keys   = n_keys;
    scorer_.window   = std::min<size_t>(std::max<uint32_t>(window, 1), n_keys);
    scorer_.q_pos    = -1;
    scorer_.q.assign(scorer_.n_layers, std::vector<float>(scorer_.window * shape_.n_head * shape_.head_dim, 0.0f));
    scorer_.k.assign(scorer_.n_layers, std::vector<float>(n_keys * shape_.n_head_kv * shape_.head_dim, 0.0f));
    new_call();
}

std::vector<llama_opt_spec_layer> llama_opt_attn_capture::scorer_layers() const {
    std::vector<llama_opt_spec_layer> out;
    if (scorer_.q_pos != scorer_.begin + (llama_pos) scorer_.n_keys - 1) {
        return out;
    }
    for (size_t il = 0; il < scorer_.q.size(); ++il) {  // also after disarm_scorer()
        out.push_back({ scorer_.q[il].data(), scorer_.k[il].data() });
    }
    return out;
}

bool llama_opt_attn_capture::observe_scorer(ggml_tensor * t, bool ask) {
    if (scorer_.cut) {
        return ask;  // ask for every node, and stop after computing it: as little as possible runs
    }
    // "Qcur-<layer>" / "Kcur-<layer>" as RoPE leaves them: head_dim × heads × n_tokens, src[1] the positions
    const bool is_q = std::strncmp(t->name, "Qcur-", 5) == 0, is_k = std::strncmp(t->name, "Kcur-", 5) == 0;
    int layer = -1;
    if ((!is_q && !is_k) || std::sscanf(t->name + 5, "%d", &layer) != 1 || layer < 0 ||
        layer >= (int) scorer_.n_layers || t->op != GGML_OP_ROPE || t->type != GGML_TYPE_F32 ||
        t->ne[0] != shape_.head_dim || t->ne[1] != (is_q ? shape_.n_head : shape_.n_head_kv) || !t->src[1] ||
        t->src[1]->type != GGML_TYPE_I32) {
        return !ask;
    }
    if (ask) {
        return true;
    }
    const int64_t          n_tokens = t->ne[2];
    std::vector<llama_pos> pos((size_t) n_tokens);
    ggml_backend_tensor_get(t->src[1], pos.data(), 0, pos.size() * sizeof(llama_pos));
    const uint32_t heads = (uint32_t) t->ne[1];
    const size_t   row   = (size_t) heads * shape_.head_dim;
    auto copy_row = [&](int64_t r, float * dst) {
        for (uint32_t h = 0; h < heads; ++h) {
            ggml_backend_tensor_get(t, dst + (size_t) h * shape_.head_dim, (size_t) r * t->nb[2] + (size_t) h * t->nb[1],
                                    shape_.head_dim * sizeof(float));
        }
    };
    // queries: of the window at the prompt's end, in whichever calls its tokens come
    const llama_pos first = is_q ? scorer_.begin + (llama_pos) (scorer_.n_keys - scorer_.window) : scorer_.begin;
    const size_t    n     = is_q ? scorer_.window : scorer_.n_keys;
    for (int64_t r = 0; r < n_tokens; ++r) {
        const llama_pos p = pos[(size_t) r] - first;
        if (p >= 0 && (size_t) p < n) {
            copy_row(r, (is_q ? scorer_.q : scorer_.k)[layer].data() + (size_t) p * row);
        }
    }
    if (is_q) {
        scorer_.q_pos = pos.back();
    }
    if (layer == (int) scorer_.n_layers - 1) {
        (is_q ? scorer_.q_seen : scorer_.k_seen) = true;
        scorer_.cut = scorer_.q_seen && scorer_.k_seen;
    }
    return !scorer_.cut;
}

bool llama_opt_attn_capture::observe(ggml_tensor * t, bool ask) {
    if (scorer_.n_layers > 0) {
        return observe_scorer(t, ask);
    }
    // "Qcur-<layer>": the queries after RoPE, before the attention scale: head_dim × n_head × n_tokens
    const int32_t slot = armed_ ? full_.slot(t->name, "Qcur") : -1;
    if (slot < 0 || t->type != GGML_TYPE_F32 || t->ne[0] != shape_.head_dim || t->ne[1] != shape_.n_head) {
        return !ask;  // ask: not needed; after computing: go on
    }
    if (ask) {
        return true;
    }
    const uint32_t n_tokens = (uint32_t) t->ne[2];
    const uint32_t n        = std::min(n_tokens, max_rows_);
    const size_t   row      = (size_t) shape_.n_head * shape_.head_dim;
    std::vector<float> & q = q_[slot];
    q.resize(n * row);
    for (uint32_t r = 0; r < n; ++r) {
        for (uint32_t h = 0; h < shape_.n_head; ++h) {
            const size_t offset = (size_t) (n_tokens - n + r) * t->nb[2] + (size_t) h * t->nb[1];
            ggml_backend_tensor_get(t, q.data() + r * row + (size_t) h * shape_.head_dim, offset,
                                    shape_.head_dim * sizeof(float));
        }
    }
    n_rows_ = n;
    return true;
}

void llama_opt_attn_keys::add(const llama_opt_attn_capture & capture, const llama_pos * positions, size_t n,
                              const uint8_t * rows, size_t stride) {
    const size_t n_layers = capture.layers().size();
    const size_t width    = capture.k_row_bytes() / sizeof(ggml_fp16_t);
    k.resize(n_layers);
    pos.insert(pos.end(), positions, positions + n);
    for (size_t i = 0; i < n_layers; ++i) {
        const size_t at = k[i].size();
        k[i].resize(at + n * width);
        for (size_t s = 0; s < n; ++s) {
            ggml_fp16_to_fp32_row((const ggml_fp16_t *) (rows + s * stride + capture.k_offset(i)),
                                  k[i].data() + at + s * width, (int64_t) width);
        }
    }
}

std::vector<float> llama_opt_attn_score(const llama_opt_attn_capture & capture, const llama_opt_attn_keys & keys,
                                        size_t q_end) {
    std::vector<float> scores(keys.pos.size(), 0.0f);
    const uint32_t n_rows = capture.n_rows();
    if (n_rows == 0 || keys.pos.empty()) {
        return scores;
    }
    std::vector<llama_pos> q_pos(n_rows);
    for (uint32_t r = 0; r < n_rows; ++r) {
        q_pos[r] = (llama_pos) (q_end - n_rows + r);
    }
    const size_t n_layers = capture.layers().size();
    for (size_t i = 0; i < n_layers; ++i) {
        llama_opt_attn_accumulate(capture.shape(), capture.queries(i).data(), q_pos.data(), n_rows,
                                  keys.k[i].data(), keys.pos.data(), keys.pos.size(), scores.data());
    }
    for (float & s : scores) {
        s /= (float) n_layers;
    }
    return scores;
}
