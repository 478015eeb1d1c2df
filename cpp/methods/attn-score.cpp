#include "methods/attn-score.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

//
// attention scores
//

// q·k in float with 8 partial sums (the compiler vectorizes them; a single running sum is a
// serial chain it may not reorder): scoring costs O(keys × queries × heads × head_dim) per layer
static float dot(const float * a, const float * b, uint32_t n) {
    float    acc[8] = { 0 };
    uint32_t d      = 0;
    for (; d + 8 <= n; d += 8) {
        for (int j = 0; j < 8; ++j) {
            acc[j] += a[d + j] * b[d + j];
        }
    }
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; d < n; ++d) {
        sum += a[d] * b[d];
    }
    return sum;
}

void llama_opt_attn_accumulate(const llama_opt_attn_shape & shape, const float * q, const llama_pos * q_pos,
                               size_t n_query, const float * k, const llama_pos * k_pos, size_t n_keys,
                               float * scores) {
    if (n_query == 0 || n_keys == 0 || shape.n_head == 0 || shape.n_head_kv == 0) {
        return;
    }
    const uint32_t group = shape.n_head / shape.n_head_kv;
    const uint32_t D     = shape.head_dim;
    std::vector<double> z(n_keys), head_max(n_keys), sum(n_keys, 0.0);
    for (size_t t = 0; t < n_query; ++t) {
        std::fill(head_max.begin(), head_max.end(), 0.0);
        for (uint32_t h = 0; h < shape.n_head; ++h) {
            const float *  qh = q + (t * shape.n_head + h) * D;
            const uint32_t g  = h / group;
            double         zmax = -std::numeric_limits<double>::infinity();
            for (size_t s = 0; s < n_keys; ++s) {
                if (k_pos[s] > q_pos[t]) {
                    z[s] = -std::numeric_limits<double>::infinity();
                    continue;
                }
                z[s] = (double) dot(qh, k + (s * shape.n_head_kv + g) * D, D) * shape.scale;
                zmax = std::max(zmax, z[s]);
            }
            if (zmax == -std::numeric_limits<double>::infinity()) {
                continue;  // this query sees none of the keys
            }
            double total = 0;
            for (size_t s = 0; s < n_keys; ++s) {
                z[s] = std::exp(z[s] - zmax);  // exp(-inf) = 0 for unseen keys
                total += z[s];
            }
            for (size_t s = 0; s < n_keys; ++s) {
                head_max[s] = std::max(head_max[s], z[s] / total);
            }
        }
        for (size_t s = 0; s < n_keys; ++s) {
            sum[s] += head_max[s];
        }
    }
    for (size_t s = 0; s < n_keys; ++s) {
        scores[s] += (float) (sum[s] / (double) n_query);
    }
}

std::vector<float> llama_opt_attn_pool(const std::vector<float> & scores, uint32_t kernel) {
    if (kernel <= 1 || scores.empty()) {
        return scores;
    }
    const size_t       half = kernel / 2;
    std::vector<float> out(scores.size());
    std::vector<double> prefix(scores.size() + 1, 0.0);
    for (size_t i = 0; i < scores.size(); ++i) {
        prefix[i + 1] = prefix[i] + scores[i];
    }
    for (size_t i = 0; i < scores.size(); ++i) {
        const size_t lo = i >= half ? i - half : 0;
        const size_t hi = std::min(scores.size(), i + half + 1);
        out[i] = (float) ((prefix[hi] - prefix[lo]) / (double) (hi - lo));
    }
    return out;
}

//
// speculative prefill
//

std::vector<float> llama_opt_spec_importance(const llama_opt_attn_shape & shape,
                                             const std::vector<llama_opt_spec_layer> & layers, size_t n_keys,
                                             uint32_t window, uint32_t last_layers, uint32_t pool) {
    std::vector<float> scores(n_keys, 0.0f);
    const size_t n_used  = last_layers == 0 ? layers.size() : std::min<size_t>(last_layers, layers.size());
    if (n_keys == 0 || n_used == 0) {
        return scores;
    }
    // the queries of the prompt's last tokens, each seeing the keys up to its own position
    const size_t           n_query = std::min<size_t>(std::max<uint32_t>(window, 1), n_keys);
    std::vector<llama_pos> k_pos(n_keys);
    std::iota(k_pos.begin(), k_pos.end(), 0);
    const std::vector<llama_pos> q_pos(k_pos.end() - (std::ptrdiff_t) n_query, k_pos.end());
    for (size_t i = layers.size() - n_used; i < layers.size(); ++i) {
        llama_opt_attn_accumulate(shape, layers[i].q, q_pos.data(), n_query, layers[i].k, k_pos.data(), n_keys,
                                  scores.data());
    }
    for (float & s : scores) {
        s /= (float) n_used;
    }
    return llama_opt_attn_pool(scores, pool);
}

std::vector<uint32_t> llama_opt_spec_keep(const std::vector<float> & importance, float keep, uint32_t window) {
    const size_t n = importance.size();
    if (n == 0) {
        return {};
    }
    // ceil, not fooled by float: 0.3f · 700 = 210.0000083
    const size_t k      = std::min(n, std::max<size_t>(1, (size_t) std::ceil((double) keep * (double) n * (1 - 1e-6))));
    const size_t forced = std::min<size_t>(k, std::max<uint32_t>(window, 1));  // the last tokens
    std::vector<uint32_t> order(n - forced);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return importance[a] > importance[b]; });
    std::vector<uint32_t> kept(order.begin(), order.begin() + (std::ptrdiff_t) (k - forced));
    for (size_t i = n - forced; i < n; ++i) {
        kept.push_back((uint32_t) i);
    }
    std::sort(kept.begin(), kept.end());
    return kept;
}

//
// attention-sink pruning
//

llama_opt_attn_pruner::llama_opt_attn_pruner(float threshold, uint32_t dead_turns_limit)
    : threshold_(threshold), dead_turns_limit_(std::max(1u, dead_turns_limit)) {}

void llama_opt_attn_pruner::update(const std::vector<float> & block_mass) {
    if (blocks_.size() < block_mass.size()) {
        blocks_.resize(block_mass.size());
    }
    for (size_t b = 0; b < block_mass.size(); ++b) {
        llama_opt_attn_block_stats & s = blocks_[b];
        if (s.evicted) {
            continue;
        }
        const bool fresh = s.avg_attn_weight == 0 && s.consecutive_dead == 0;
        s.avg_attn_weight  = fresh ? block_mass[b] : 0.5f * (s.avg_attn_weight + block_mass[b]);
        s.consecutive_dead = block_mass[b] < threshold_ ? s.consecutive_dead + 1 : 0;
    }
}

std::vector<uint32_t> llama_opt_attn_pruner::eviction_candidates(size_t first, size_t last, size_t budget) const {
    last = std::min(last, blocks_.size());
    std::vector<uint32_t> live;
    for (size_t b = first; b < last; ++b) {
        if (!blocks_[b].evicted) {
            live.push_back((uint32_t) b);
        }
    }
    std::stable_sort(live.begin(), live.end(), [this](uint32_t a, uint32_t b) {
        return blocks_[a].avg_attn_weight < blocks_[b].avg_attn_weight;
    });
    std::vector<uint32_t> out;
    for (uint32_t b : live) {
        const bool dead       = blocks_[b].consecutive_dead >= dead_turns_limit_;
        const bool over_budget = live.size() - out.size() > budget;
        if (dead || over_budget) {
            out.push_back(b);
        }
    }
    return out;
}

void llama_opt_attn_pruner::set_limits(float threshold, uint32_t dead_turns_limit) {
    threshold_        = threshold;
    dead_turns_limit_ = std::max(1u, dead_turns_limit);
}

void llama_opt_attn_pruner::set_evicted(uint32_t block, bool evicted) {
    if (block >= blocks_.size()) {
        blocks_.resize(block + 1);
    }
    blocks_[block].evicted = evicted;
    if (!evicted) {
        blocks_[block].consecutive_dead = 0;  // restored because it is relevant again
    }
}

void llama_opt_attn_pruner::truncate(size_t n_blocks) {
    blocks_.resize(std::min(blocks_.size(), n_blocks));
}

//
// sparse attention over tool results
//

llama_opt_sparse_scorer::llama_opt_sparse_scorer(const llama_opt_sparse_params & params, std::vector<llama_token> cue_tokens)
    : params_(params), cues_(std::move(cue_tokens)) {
    params_.span = std::max(1u, params_.span);
    std::sort(cues_.begin(), cues_.end());
}

std::vector<llama_opt_relevance_span> llama_opt_sparse_scorer::score(const llama_token * tool, uint32_t n_tool,
                                                                     const llama_token * query, uint32_t n_query) const {
    std::vector<llama_opt_relevance_span> spans;
    if (n_tool == 0) {
        return spans;
    }
    std::unordered_map<llama_token, uint32_t> count;  // rarity within the tool result
    for (uint32_t i = 0; i < n_tool; ++i) {
        ++count[tool[i]];
    }
    const std::unordered_set<llama_token> asked(query, query + n_query);
    const uint32_t n_spans = (n_tool + params_.span - 1) / params_.span;
    std::vector<double> overlap(n_spans, 0.0);
    std::vector<bool>   cue(n_spans, false);
    for (uint32_t k = 0; k < n_spans; ++k) {
        const uint32_t begin = k * params_.span, end = std::min(n_tool, begin + params_.span);
        std::unordered_set<llama_token> seen;
        double shared = 0, total = 0;
        for (uint32_t i = begin; i < end; ++i) {
            if (!seen.insert(tool[i]).second) {
                continue;
            }
            const double w = 1.0 / count[tool[i]];
            total += w;
            shared += asked.count(tool[i]) ? w : 0.0;
            cue[k] = cue[k] || std::binary_search(cues_.begin(), cues_.end(), tool[i]);
        }
        overlap[k] = total > 0 ? shared / total : 0.0;
        spans.push_back({ begin, end - begin, 0.0f });
    }
    const double best = *std::max_element(overlap.begin(), overlap.end());
    for (uint32_t k = 0; k < n_spans; ++k) {
        const double recency = n_spans == 1 ? 1.0 : (double) k / (n_spans - 1);
        const double o       = best > 0 ? overlap[k] / best : 0.0;
        spans[k].score = (float) (0.8 * o + 0.1 * recency + 0.1 * (cue[k] ? 1.0 : 0.0));
    }
    return spans;
}

std::vector<llama_opt_relevance_span> llama_opt_sparse_scorer::drops(const std::vector<llama_opt_relevance_span> & spans,
                                                                     uint32_t n_tool) const {
    const uint32_t lo = std::min(n_tool, params_.keep_edges);
    const uint32_t hi = n_tool > params_.keep_edges ? std::max(lo, n_tool - params_.keep_edges) : lo;
    // the droppable part of each span (outside the edges), lowest score first
    std::vector<llama_opt_relevance_span> part;
    for (const llama_opt_relevance_span & s : spans) {
        const uint32_t begin = std::max(s.start, lo), end = std::min(s.start + s.length, hi);
        if (begin < end) {
            part.push_back({ begin, end - begin, s.score });
        }
    }
    std::stable_sort(part.begin(), part.end(), [](const auto & a, const auto & b) { return a.score < b.score; });
    const double budget = params_.budget > 0 ? params_.budget * n_tool : (double) n_tool;
    double       kept   = n_tool;
    std::vector<llama_opt_relevance_span> dropped;
    for (const llama_opt_relevance_span & s : part) {
        if (s.score < params_.threshold || kept > budget) {
            dropped.push_back(s);
            kept -= s.length;
        }
    }
    std::sort(dropped.begin(), dropped.end(), [](const auto & a, const auto & b) { return a.start < b.start; });
    std::vector<llama_opt_relevance_span> out;
    for (const llama_opt_relevance_span & s : dropped) {
        if (!out.empty() && out.back().start + out.back().length == s.start) {
            out.back().length += s.length;
            out.back().score = std::max(out.back().score, s.score);
        } else {
            out.push_back(s);
        }
    }
    return out;
}
