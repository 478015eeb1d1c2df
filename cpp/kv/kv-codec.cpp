#include "kv/kv-codec.h"

#include "base/types.h"

static llama_opt_kv_part part_of(const std::string & own, const std::string & own_setting, const std::string & both) {
    llama_opt_kv_part part;
    part.setting = own.empty() ? "kv_type" : own_setting;
    part.name    = own.empty() ? both : own;
    part.type    = part.name == "q8_0" ? GGML_TYPE_Q8_0 : part.name == "q4_0" ? GGML_TYPE_Q4_0 : GGML_TYPE_F16;
    return part;
}

llama_opt_kv_codec llama_opt_kv_codec::from_config(const llama_opt_config & cfg) {
    llama_opt_kv_codec codec;
    codec.k = part_of(cfg.kv_type_k, "kv_type_k", cfg.kv_type);
    codec.v = part_of(cfg.kv_type_v, "kv_type_v", cfg.kv_type);
    return codec;
}

static std::string type_name(int32_t type) {
    return type >= 0 && type < GGML_TYPE_COUNT ? ggml_type_name((ggml_type) type) : "type " + std::to_string(type);
}

std::string llama_opt_kv_types_name(int32_t k_type, int32_t v_type) {
    return k_type == v_type ? type_name(k_type) : type_name(k_type) + "/" + type_name(v_type);
}

std::string llama_opt_kv_codec::name() const {
    return llama_opt_kv_types_name(k.type, v.type);  // (ggml's names are the settings' values)
}

static std::string named(const llama_opt_kv_part & part, const std::string & type) {
    return part.setting + "='" + type + "'";
}

void llama_opt_kv_codec::check(const llama_opt_model & model, bool flash_attn) const {
    if (v.quantized() && !flash_attn) {
        throw llama_opt_error(llama_opt_errc::config,
            named(v, v.name) + " stores V quantized, which llama.cpp computes only with flash attention: create "
            "the Context with flash_attn=True, or use " + named(v, "f16"), v.setting);
    }
    if (k.quantized() && !flash_attn) {
        throw llama_opt_error(llama_opt_errc::config,
            named(k, k.name) + " stores K quantized: llama.cpp computes that without flash attention too, but "
            "pyllamaopt's exact reuse with a quantized cache is built and tested on flash attention's paths only "
            "(docs/exactness.md): create the Context with flash_attn=True, or use " + named(k, "f16"), k.setting);
    }
    const auto dims  = model.head_dims();
    const bool alike = k.setting == v.setting && k.type == v.type;  // kv_type set both: say so once
    for (const auto * part : { &k, &v }) {
        const uint32_t block = (uint32_t) ggml_blck_size(part->type);
        const uint32_t dim   = part == &k ? dims.first : dims.second;
        if (!part->quantized() || dim % block == 0) {
            continue;
        }
        throw llama_opt_error(llama_opt_errc::config,
            named(*part, part->name) + " stores " + (alike ? "K and V" : part == &k ? "K" : "V") + " in blocks of " +
            std::to_string(block) + " values, which do not divide this model's attention heads (K " +
            std::to_string(dims.first) + ", V " + std::to_string(dims.second) + " values): use " +
            named(*part, "f16") + " for this model", part->setting);
    }
}

uint64_t llama_opt_kv_codec::memory_bytes(const llama_opt_model & model, uint64_t n_tokens) const {
    const auto     dims = model.head_dims();
    const uint64_t heads = (uint64_t) model.n_layer() * (uint64_t) model.n_head_kv();
    return n_tokens * heads * (ggml_row_size(k.type, dims.first) + ggml_row_size(v.type, dims.second));
}
