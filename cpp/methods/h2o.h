#pragma once

// methods/h2o: the host-side state of H2O chunked sparse prefill (specification 004, Tier 2):
// per-layer heavy-hitter scores (BF16, [kv_size, n_head]), per-layer memory sets (I32, [M, n_head],
// M = L + H), the chunk state, and the three steps between two chunks: scores of the chunk just
// computed (column sums of its attention weights), scores added to the memory set's tokens, and
// the next memory set (the local window plus the top-H heavy hitters of each head, sorted).
// Plain C++17, nothing of llama.cpp: the engine feeds it the column sums the graph computed and
// gives the memory sets to the graph (docs/h2o.md).
//
// Scores and memory sets are indexed by token position in the prompt (0 .. kv_size-1), not by
// KV cell: the engine maps positions to cells, so that this state does not depend on where the
// cache put a token.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

struct llama_h2o_params {
    uint32_t local_window = 256;  // L: the most recent tokens before a chunk, always attended
    uint32_t heavy_budget = 256;  // H: heavy hitters per head beyond the local window
    uint32_t chunk_size   = 512;  // S: prompt tokens per chunk

    uint32_t memory_size() const { return local_window + heavy_budget; }  // M = L + H
};

// "" if the parameters are usable, else what is wrong and what to do: 0 < M <= S. (The specification
// writes M < S, but the target setting is L = H = 256, S = 512, M = S; nothing in the
// method needs the strict bound: docs/h2o.md.)
std::string llama_h2o_check_params(const llama_h2o_params & params);

// BF16 as ggml stores it: the high 16 bits of an IEEE float, rounded to nearest even.
uint16_t llama_h2o_fp32_to_bf16(float value);
float    llama_h2o_bf16_to_fp32(uint16_t value);

// A 2-D tensor's shape and byte strides, in ggml's convention (ne[0] is the contiguous dimension).
struct llama_h2o_layout {
    int64_t ne[2];
    size_t  nb[2];
};

struct llama_h2o_chunk_state {
    uint32_t              chunk_idx        = 0;  // chunks completed
    uint32_t              tokens_processed = 0;  // prompt tokens in them
    std::vector<uint32_t> chunk_boundaries = { 0 };  // first position of each chunk, and the next one's
};

// Column sums of one chunk's attention weights: for each head and key, the sum over queries.
// weights: n_head × n_query × n_key (row-major, one softmax row per query); out: n_head × n_key.
// The engine has the graph compute them (patches/0010's "kq_colsum"); this is the definition the
// unit tests and bench-h2o hold the scores to.
void llama_h2o_column_sums(const float * weights, uint32_t n_head, uint32_t n_query, uint32_t n_key, float * out);

// Zero-initialized storage that costs nothing until it is touched: calloc's pages come zeroed from
// the operating system, so allocating the scores of a 128k-position cache is immediate and a prompt
// commits only the pages of its own positions (a std::vector would write every zero up front).
class llama_h2o_zeroed_u16 {
public:
    explicit llama_h2o_zeroed_u16(size_t n = 0);
    llama_h2o_zeroed_u16(const llama_h2o_zeroed_u16 & other);
    llama_h2o_zeroed_u16 & operator=(const llama_h2o_zeroed_u16 & other);
    llama_h2o_zeroed_u16(llama_h2o_zeroed_u16 &&) noexcept            = default;
    llama_h2o_zeroed_u16 & operator=(llama_h2o_zeroed_u16 &&) noexcept = default;

    uint16_t *       data() { return data_.get(); }
    const uint16_t * data() const { return data_.get(); }
    size_t           size() const { return size_; }
    void             clear();  // all zero again (fresh pages)

private:
    struct deleter {
        void operator()(uint16_t * p) const { std::free(p); }
    };
    std::unique_ptr<uint16_t[], deleter> data_;
    size_t                               size_ = 0;
};

// What one layer attends to for a chunk (patches/0010's llama_set_attn_subset): each head's memory
// set, ascending (pos: n_head × n_mem, every head's set has the same size), then causally the
// chunk's own n_tokens tokens. Each head computes over its own n_mem + n_tokens keys only.
struct llama_h2o_subset {
    std::vector<int32_t> pos;
    uint32_t             n_mem    = 0;
    uint32_t             n_tokens = 0;

    size_t n_keys() const { return (size_t) n_mem + n_tokens; }
};

class llama_h2o {
public:
    static constexpr int32_t EMPTY = -1;  // an unused memory slot

    // `n_layer`: the layers H2O applies to (the engine maps model layers onto 0 .. n_layer-1);
    // `kv_size`: the longest prompt. Throws std::invalid_argument for bad parameters or sizes.
    llama_h2o(const llama_h2o_params & params, uint32_t n_layer, uint32_t n_head, uint32_t kv_size);

    // Scores of the chunk [chunk_start, chunk_start + chunk_len) from its own attention:
    // colsum is n_head × chunk_len; they replace whatever the positions held.
    void init_chunk_scores(uint32_t il, uint32_t chunk_start, uint32_t chunk_len, const float * colsum);

    // Adds the attention the last chunk paid to the memory set: colsum is n_head × M, slot for
    // slot as memory(il) lists them (empty slots' values are ignored). Values must be finite and
    // >= 0 (softmax weights), else std::invalid_argument and nothing changes.
    void accumulate_memory_scores(uint32_t il, const float * colsum);

    // The memory set for the queries from `chunk_end` on: per head, the local window
    // [chunk_end - L, chunk_end) and the H highest-scoring candidates among the previous memory
    // set and the current chunk [chunk_boundaries.back(), chunk_end) outside the window (ties:
    // the earlier position), all below chunk_end, sorted ascending, unused slots EMPTY at the end.
    void build_memory_set(uint32_t il, uint32_t chunk_end);

    // The chunk of `chunk_len` tokens is done (every layer's memory set built).
    void next_chunk(uint32_t chunk_len);

    // Layer il's subset for the next chunk of n_tokens queries (from chunk_boundaries.back()).
    void subset(uint32_t il, uint32_t n_tokens, llama_h2o_subset & out) const;

    // After the chunk: its column sums over `sub`'s keys (n_head × sub.n_keys(), the sum of each
    // head's softmax weights over the chunk's queries, key by key as sub lists them) go to the
    // memory set's scores (accumulated) and the chunk's own (initialized), and the next memory set
    // is built. std::invalid_argument if `sub` is not this layer's subset for this chunk.
    void update_layer(uint32_t il, const llama_h2o_subset & sub, const float * colsum);

    // A new prompt: scores 0, memory sets empty, chunk state back to the start.
    void reset();

    float score(uint32_t il, uint32_t head, uint32_t pos) const {
        return llama_h2o_bf16_to_fp32(scores_[il].data()[(size_t) head * kv_size_ + pos]);
    }
    const uint16_t * scores(uint32_t il) const { return scores_[il].data(); }  // BF16 [kv_size, n_head]
    uint16_t *       scores(uint32_t il) { return scores_[il].data(); }
    const int32_t *  memory(uint32_t il) const { return memory_[il].data(); }  // I32 [M, n_head]
    uint64_t         memory_count(uint32_t il) const;  // entries of layer il's memory sets (all heads)
    bool             memory_initialized() const { return memory_initialized_; }

    llama_h2o_layout scores_layout() const;
    llama_h2o_layout memory_layout() const;
    size_t           bytes() const;  // scores and memory sets of every layer

    const llama_h2o_params &      params() const { return params_; }
    const llama_h2o_chunk_state & state() const { return state_; }
    uint32_t                      n_layer() const { return (uint32_t) scores_.size(); }
    uint32_t                      n_head() const { return n_head_; }
    uint32_t                      kv_size() const { return kv_size_; }

private:
    void check_layer(uint32_t il) const;

    llama_h2o_params                   params_;
    uint32_t                           n_head_;
    uint32_t                           kv_size_;
    std::vector<llama_h2o_zeroed_u16>  scores_;  // by layer: [head * kv_size + pos]
    std::vector<std::vector<int32_t>>  memory_;  // by layer: [head * M + slot]
    llama_h2o_chunk_state              state_;
    bool                               memory_initialized_ = false;

    struct candidate {
        float   score;
        int32_t pos;
    };
    std::vector<candidate> candidates_;  // scratch of build_memory_set
    std::vector<int32_t>   selected_;    // scratch of build_memory_set
    std::vector<float>     inter_;       // scratch of update_layer: the memory set's column sums
    std::vector<float>     intra_;       // scratch of update_layer: the chunk's
};

// The KV cache bytes per token of `n_layer_kv` layers with F16 K and V of n_head_kv × head_dim,
// and the share of them that H2O's per-token scores add for `n_layer_h2o` layers of n_head query
// heads (BF16): n_layer_h2o · n_head · 2 / (n_layer_kv · 2 · n_head_kv · head_dim · 2). The
// memory sets add a fixed M · n_head · 4 bytes per layer on top.
double llama_h2o_score_overhead(uint32_t n_layer_h2o, uint32_t n_head, uint32_t n_layer_kv, uint32_t n_head_kv,
                                uint32_t head_dim);
