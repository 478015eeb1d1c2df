#pragma once

// kv/kv-codec: the KV compressor seam (specification 003 §11.11: compress / decompress / evict /
// memory_bytes, an identity codec by default): how a context's cache stores K and V. The codecs
// behind it are llama.cpp's cache types: "f16" (the identity of the specification: llama.cpp's
// default, what every path was built on) and the quantized "q8_0" / "q4_0".
//
// The seam is a value, not a virtual interface, and it is honest to say that it is little more
// than llama.cpp's type_k/type_v: a codec that is no ggml type cannot sit behind it without
// patching the attention graph. compress happens inside llama.cpp's graph (the K/V rows a ubatch
// computes are converted to the cache's type where they are stored, ggml_set_rows); decompress
// inside the attention kernel (flash attention dots each query, converted to K's dot-product
// type, with K rows as stored, and converts V rows as it accumulates them; llama.cpp's K-shift
// dequantizes, rotates and quantizes again); evict is the KV memory's (kv/memory: whole
// sequences, least recently used first, the same for every codec). What is left for the seam:
// which type, whether this model and context can run it, and memory_bytes. Everything that moves
// stored rows (the disk tier, Tier-2 moves, sharing) moves them as opaque bytes of the type.

#include "engine/model.h"
#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct llama_opt_kv_codec {
    std::string name = "f16";  // one of LLAMA_OPT_KV_TYPES (base/config.h)
    ggml_type   type = GGML_TYPE_F16;  // for K and V alike (docs/architecture.md: why not two types)

    // The codec of a kv_type value (validated by the configuration already).
    static llama_opt_kv_codec from_name(const std::string & name);

    bool identity() const { return type == GGML_TYPE_F16; }

    // Throws llama_opt_error(config) with what to do when this context cannot use the codec: a
    // quantized V needs flash attention, and the type's block must divide the heads' dimensions.
    void check(const llama_opt_model & model, bool flash_attn) const;

    // memory_bytes: the bytes n_tokens positions take in the cache, K and V of all layers.
    uint64_t memory_bytes(const llama_opt_model & model, uint64_t n_tokens = 1) const;
};
