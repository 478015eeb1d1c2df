#include "kv/kv-codec.h"

#include "base/types.h"

llama_opt_kv_codec llama_opt_kv_codec::from_name(const std::string & name) {
    llama_opt_kv_codec codec;
    codec.name = name;
    codec.type = name == "q8_0" ? GGML_TYPE_Q8_0 : name == "q4_0" ? GGML_TYPE_Q4_0 : GGML_TYPE_F16;
    return codec;
}

void llama_opt_kv_codec::check(const llama_opt_model & model, bool flash_attn) const {
    if (identity()) {
        return;
    }
    if (!flash_attn) {
        throw llama_opt_error(llama_opt_errc::config,
            "kv_type='" + name + "' stores V quantized, which llama.cpp computes only with flash attention: create "
            "the Context with flash_attn=True, or use kv_type='f16'", "kv_type");
    }
    const auto     dims  = model.head_dims();
    const uint32_t block = (uint32_t) ggml_blck_size(type);
    if (dims.first % block != 0 || dims.second % block != 0) {
        throw llama_opt_error(llama_opt_errc::config,
            "kv_type='" + name + "' stores K and V in blocks of " + std::to_string(block) + " values, which do not "
            "divide this model's attention heads (K " + std::to_string(dims.first) + ", V " + std::to_string(dims.second) +
            " values): use kv_type='f16' for this model", "kv_type");
    }
}

uint64_t llama_opt_kv_codec::memory_bytes(const llama_opt_model & model, uint64_t n_tokens) const {
    const auto     dims = model.head_dims();
    const uint64_t heads = (uint64_t) model.n_layer() * (uint64_t) model.n_head_kv();
    return n_tokens * heads * (ggml_row_size(type, dims.first) + ggml_row_size(type, dims.second));
}
