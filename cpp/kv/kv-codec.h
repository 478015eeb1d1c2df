#pragma once

// kv/kv-codec: the KV compressor seam (specification 003 §11.11: compress / decompress / evict /
// memory_bytes, an identity codec by default): how a context's cache stores K and V. The codecs
// behind it are llama.cpp's cache types: "f16" (the identity of the specification: llama.cpp's
// default, what every path was built on) and the quantized "q8_0" / "q4_0", for K and V each
// (kv_type sets both; kv_type_k / kv_type_v one, as llama-server's --cache-type-k / -v).
//
// The seam is a value, not a virtual interface, and it is honest to say that it is little more
// than llama.cpp's type_k/type_v: a codec that is no ggml type cannot sit behind it without
// patching the attention graph. compress happens inside llama.cpp's graph (the K/V rows a ubatch
// computes are converted to the cache's type where they are stored, ggml_set_rows); decompress
// inside the attention kernel (flash attention dots each query, converted to K's dot-product
// type, with K rows as stored, and converts V rows as it accumulates them; llama.cpp's K-shift
// dequantizes, rotates and quantizes again); evict is the KV memory's (kv/memory: whole
// sequences, least recently used first, the same for every codec). What is left for the seam:
// which types, whether this model and context can run them, and memory_bytes. Everything that moves
// stored rows (the disk tier, Tier-2 moves, sharing) moves them as opaque bytes of the types.

#include "base/config.h"
#include "engine/model.h"
#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <string>

// How one of K and V is stored, and the setting that chose it (which errors name).
struct llama_opt_kv_part {
    std::string name    = "f16";  // one of LLAMA_OPT_KV_TYPES (base/config.h)
    ggml_type   type    = GGML_TYPE_F16;
    std::string setting = "kv_type";  // or "kv_type_k" / "kv_type_v" when that one was set

    bool quantized() const { return type != GGML_TYPE_F16; }
};

// "q8_0" when K and V share a type, "K/V" ("q8_0/q4_0") when they differ: the name of a pair of
// ggml types as Context.kv_type gives it (a disk entry's too, whose numbers may be any: "type 99").
std::string llama_opt_kv_types_name(int32_t k_type, int32_t v_type);

struct llama_opt_kv_codec {
    llama_opt_kv_part k;
    llama_opt_kv_part v;

    // The codec of a configuration (its kv_type* values validated already): kv_type_k / kv_type_v
    // where set, else kv_type.
    static llama_opt_kv_codec from_config(const llama_opt_config & cfg);

    // llama_opt_kv_types_name of K's and V's: Context.kv_type, and the type in the disk tier's identity.
    std::string name() const;

    bool identity() const { return !k.quantized() && !v.quantized(); }

    // Throws llama_opt_error(config) with what to do when this context cannot use the codec: a
    // quantized V needs flash attention (llama.cpp's rule), a quantized K too (ours: exactness is
    // built on flash attention's paths), and a type's block must divide its heads' dimension.
    void check(const llama_opt_model & model, bool flash_attn) const;

    // memory_bytes: the bytes n_tokens positions take in the cache: K's rows and V's rows of all
    // layers, each in its type.
    uint64_t memory_bytes(const llama_opt_model & model, uint64_t n_tokens = 1) const;
};
