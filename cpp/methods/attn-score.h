#pragma once

// methods/attn-score: the host-side arithmetic of the Tier-2 methods that drop KV from attention
// (specification 000 §4.1 attention-sink pruning, §4.2 sparse attention over tool results,
// 001 host-side scoring). Needs nothing of llama.cpp: the engine (methods/attn-capture) feeds
// it queries observed in the running model and keys read from the KV cache.

#include "base/types.h"

#include <cstddef>
#include <cstdint>
#include <vector>

//
// attention scores (specification 001)
//

struct llama_opt_attn_shape {
    uint32_t n_head    = 0;  // query heads
    uint32_t n_head_kv = 0;  // key/value heads (GQA: query head h reads KV head h / (n_head / n_head_kv))
    uint32_t head_dim  = 0;
    float    scale     = 0;  // the model's attention scale (1/sqrt(head_dim) for most models)
};

// One layer's contribution: for each query (q: n_query × n_head × head_dim, at positions
// q_pos) and head, the softmax over the keys it sees (k: n_keys × n_head_kv × head_dim at
// positions k_pos; a key is seen when k_pos <= q_pos) of scale · q·k, numerically stable
// (max subtracted); the max over heads; the mean over queries; added to scores[0, n_keys).
// Keys no query sees get nothing.
void llama_opt_attn_accumulate(const llama_opt_attn_shape & shape, const float * q, const llama_pos * q_pos,
                               size_t n_query, const float * k, const llama_pos * k_pos, size_t n_keys,
                               float * scores);

// Average pooling over neighbouring keys (001's pool_kernel_size): kernel 1 leaves the scores
// as they are; an even kernel is widened to the next odd one.
std::vector<float> llama_opt_attn_pool(const std::vector<float> & scores, uint32_t kernel);

//
// speculative prefill (001): which prompt tokens the target computes
//

// One scorer layer's view of the prompt: the queries of its last `window` tokens (window × n_head ×
// head_dim, in position order) and every prompt token's keys (n_keys × n_head_kv × head_dim), in
// layer order.
struct llama_opt_spec_layer {
    const float * q;
    const float * k;
};

// 001's importance of each of n_keys prompt tokens: per layer, each of the last min(window, n_keys)
// tokens' softmax (per query head, over the keys up to its own position; GQA mapping,
// `shape.scale`) and its max over heads, averaged over those queries (001: window 1, the last
// token's; a wider observation window, as SnapKV's, reads what the prompt's question looks for);
// the mean over the last `last_layers` layers (0: all of them; 001's `last4` and `last1` are 4
// and 1); then average pooling over `pool` neighbours (1: none).
std::vector<float> llama_opt_spec_importance(const llama_opt_attn_shape & shape,
                                             const std::vector<llama_opt_spec_layer> & layers, size_t n_keys,
                                             uint32_t window, uint32_t last_layers, uint32_t pool);

// 001's top-k: the indices of the ceil(keep · n) most important tokens (at least one), the last
// min(window, k) tokens always among them (they take the places of the least important otherwise
// kept: the budget holds; 001: window 1, the last token), ties to the earlier token, in increasing
// order.
std::vector<uint32_t> llama_opt_spec_keep(const std::vector<float> & importance, float keep, uint32_t window = 1);

//
// attention-sink pruning (000 §4.1): per-block rolling statistics across turns
//

struct llama_opt_attn_block_stats {
    float    avg_attn_weight  = 0;  // rolling (exponential, 1/2) average of the block's attention mass per turn
    uint32_t consecutive_dead = 0;  // turns in a row below the threshold
    bool     evicted          = false;
};

class llama_opt_attn_pruner {
public:
    llama_opt_attn_pruner(float threshold, uint32_t dead_turns_limit);

    // One turn's attention mass of each block (index = block of the history). Blocks beyond the
    // known ones are added; evicted blocks' statistics are not changed (they were not attended).
    void update(const std::vector<float> & block_mass);

    // Blocks to evict now, lowest rolling average first: every live block in [first, last) dead
    // for the window, then, while more than `budget` blocks of [first, last) are live, the
    // lowest of the rest (budget = SIZE_MAX: no budget). Blocks outside [first, last) are
    // guarded (attention sinks and the system prompt below, the recent turns above).
    std::vector<uint32_t> eviction_candidates(size_t first, size_t last, size_t budget) const;

    // New limits (the configuration's), the statistics kept.
    void set_limits(float threshold, uint32_t dead_turns_limit);
    void set_evicted(uint32_t block, bool evicted);
    // The history was cut to `n_blocks` blocks.
    void truncate(size_t n_blocks);

    const std::vector<llama_opt_attn_block_stats> & blocks() const { return blocks_; }
    float threshold() const { return threshold_; }

private:
    float                                   threshold_;
    uint32_t                                dead_turns_limit_;
    std::vector<llama_opt_attn_block_stats> blocks_;
};

//
// sparse attention over tool results (000 §4.2)
//

struct llama_opt_relevance_span {
    uint32_t start;   // first token, relative to the tool result
    uint32_t length;  // tokens
    float    score;   // relevance in [0, 1]
};

struct llama_opt_sparse_params {
    float    threshold  = 0.1f;  // spans scoring below it leave attention
    uint32_t span       = 64;    // tokens per scored span
    uint32_t keep_edges = 64;    // first and last tokens of every tool result always kept
    float    budget     = 0.0f;  // share of the tool result kept at most (0: the threshold alone decides)
};

// Lightweight relevance (no neural network), 000 §4.2: token overlap with the query (the
// share of the span's distinct tokens, weighted by rarity in the tool result, that the query
// contains), position recency within the tool result, and structural cues: spans holding a
// token of `cue_tokens` (error lines, definitions: the tokenizer's ids of such words).
// Weights: overlap 0.8 (relative to the best span), recency 0.1, cue 0.1.
class llama_opt_sparse_scorer {
public:
    explicit llama_opt_sparse_scorer(const llama_opt_sparse_params & params, std::vector<llama_token> cue_tokens = {});

    std::vector<llama_opt_relevance_span> score(const llama_token * tool_result, uint32_t n_tool_tokens,
                                                const llama_token * query, uint32_t n_query_tokens) const;

    // The spans to drop from attention: below the threshold, and with a budget the lowest
    // scoring others while more than budget · n_tool_tokens would stay; never the kept edges
    // (spans are cut to them); merged when adjacent; relative to the tool result.
    std::vector<llama_opt_relevance_span> drops(const std::vector<llama_opt_relevance_span> & spans,
                                                uint32_t n_tool_tokens) const;

    const llama_opt_sparse_params & params() const { return params_; }

private:
    llama_opt_sparse_params  params_;
    std::vector<llama_token> cues_;  // sorted
};
