#include "methods/h2o.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

std::string llama_h2o_check_params(const llama_h2o_params & params) {
    const uint64_t m = (uint64_t) params.local_window + params.heavy_budget;
    if (m == 0) {
        return "H2O's memory set is empty (local window + heavy budget = 0): set LLAMA_OPT_H2O_LOCAL_WINDOW or "
               "LLAMA_OPT_H2O_HEAVY_BUDGET above 0";
    }
    if (m > params.chunk_size) {
        return "H2O's memory set (local window " + std::to_string(params.local_window) + " + heavy budget " +
               std::to_string(params.heavy_budget) + " = " + std::to_string(m) + ") must not exceed the chunk (" +
               std::to_string(params.chunk_size) + " tokens): raise LLAMA_OPT_H2O_CHUNK_SIZE or lower the window or budget";
    }
    return "";
}

uint16_t llama_h2o_fp32_to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((bits >> 16) | 64);  // NaN stays a (quiet) NaN
    }
    return (uint16_t) ((bits + (0x7fffu + ((bits >> 16) & 1u))) >> 16);
}

float llama_h2o_bf16_to_fp32(uint16_t value) {
    const uint32_t bits = (uint32_t) value << 16;
    float result;
    std::memcpy(&result, &bits, sizeof(result));
    return result;
}

void llama_h2o_column_sums(const float * weights, uint32_t n_head, uint32_t n_query, uint32_t n_key, float * out) {
    for (uint32_t h = 0; h < n_head; ++h) {
        float * sum = out + (size_t) h * n_key;
        std::fill(sum, sum + n_key, 0.0f);
        for (uint32_t i = 0; i < n_query; ++i) {
            const float * row = weights + ((size_t) h * n_query + i) * n_key;
            for (uint32_t j = 0; j < n_key; ++j) {
                sum[j] += row[j];
            }
        }
    }
}

llama_h2o_zeroed_u16::llama_h2o_zeroed_u16(size_t n) : size_(n) {
    if (n > 0) {
        data_.reset(static_cast<uint16_t *>(std::calloc(n, sizeof(uint16_t))));
        if (!data_) {
            throw std::bad_alloc();
        }
    }
}

llama_h2o_zeroed_u16::llama_h2o_zeroed_u16(const llama_h2o_zeroed_u16 & other) : llama_h2o_zeroed_u16(other.size_) {
    if (size_ > 0) {
        std::memcpy(data_.get(), other.data_.get(), size_ * sizeof(uint16_t));
    }
}

llama_h2o_zeroed_u16 & llama_h2o_zeroed_u16::operator=(const llama_h2o_zeroed_u16 & other) {
    if (this != &other) {
        *this = llama_h2o_zeroed_u16(other);
    }
    return *this;
}

void llama_h2o_zeroed_u16::clear() {
    *this = llama_h2o_zeroed_u16(size_);
}

static void check_weight(float value, size_t at, const char * what) {
    if (!(value >= 0.0f) || !std::isfinite(value)) {
        throw std::invalid_argument(std::string("H2O: ") + what +
                                    " must be finite and >= 0 (sums of softmax weights), got " +
                                    std::to_string(value) + " at " + std::to_string(at));
    }
}

llama_h2o::llama_h2o(const llama_h2o_params & params, uint32_t n_layer, uint32_t n_head, uint32_t kv_size)
    : params_(params), n_head_(n_head), kv_size_(kv_size) {
    const std::string error = llama_h2o_check_params(params);
    if (!error.empty()) {
        throw std::invalid_argument(error);
    }
    if (n_layer == 0 || n_head == 0 || kv_size == 0) {
        throw std::invalid_argument("H2O needs at least one layer, head and position (got " + std::to_string(n_layer) +
                                    ", " + std::to_string(n_head) + ", " + std::to_string(kv_size) + ")");
    }
    for (uint32_t il = 0; il < n_layer; ++il) {
        scores_.emplace_back((size_t) kv_size * n_head);
    }
    memory_.assign(n_layer, std::vector<int32_t>((size_t) params.memory_size() * n_head, EMPTY));
}

void llama_h2o::check_layer(uint32_t il) const {
    if (il >= scores_.size()) {
        throw std::out_of_range("H2O: layer " + std::to_string(il) + " of " + std::to_string(scores_.size()));
    }
}

void llama_h2o::init_chunk_scores(uint32_t il, uint32_t chunk_start, uint32_t chunk_len, const float * colsum) {
    check_layer(il);
    if ((uint64_t) chunk_start + chunk_len > kv_size_) {
        throw std::out_of_range("H2O: chunk [" + std::to_string(chunk_start) + ", " +
                                std::to_string((uint64_t) chunk_start + chunk_len) + ") beyond " +
                                std::to_string(kv_size_) + " positions");
    }
    for (size_t i = 0; i < (size_t) n_head_ * chunk_len; ++i) {
        check_weight(colsum[i], i, "a chunk's column sums");
    }
    for (uint32_t h = 0; h < n_head_; ++h) {
        uint16_t *    dst = scores_[il].data() + (size_t) h * kv_size_ + chunk_start;
        const float * src = colsum + (size_t) h * chunk_len;
        for (uint32_t j = 0; j < chunk_len; ++j) {
            dst[j] = llama_h2o_fp32_to_bf16(src[j]);
        }
    }
}

void llama_h2o::accumulate_memory_scores(uint32_t il, const float * colsum) {
    check_layer(il);
    if (!memory_initialized_) {
        throw std::logic_error("H2O: memory scores accumulated before the first memory set was built");
    }
    const uint32_t  m   = params_.memory_size();
    const int32_t * mem = memory_[il].data();
    bool            ok  = true;
    for (size_t s = 0; s < (size_t) n_head_ * m; ++s) {
        ok &= mem[s] == EMPTY || (colsum[s] >= 0.0f && colsum[s] <= std::numeric_limits<float>::max());
    }
    if (!ok) {
        for (size_t s = 0; s < (size_t) n_head_ * m; ++s) {
            if (mem[s] != EMPTY) {
                check_weight(colsum[s], s, "the memory set's column sums");
            }
        }
    }
    uint16_t * scores = scores_[il].data();
    for (uint32_t h = 0; h < n_head_; ++h) {
        for (uint32_t slot = 0; slot < m; ++slot) {
            const size_t  s   = (size_t) h * m + slot;
            const int32_t pos = mem[s];
            if (pos == EMPTY) {
                continue;
            }
            uint16_t & score = scores[(size_t) h * kv_size_ + pos];
            score            = llama_h2o_fp32_to_bf16(llama_h2o_bf16_to_fp32(score) + colsum[s]);
        }
    }
}

void llama_h2o::build_memory_set(uint32_t il, uint32_t chunk_end) {
    check_layer(il);
    if (chunk_end > kv_size_) {
        throw std::out_of_range("H2O: memory set for position " + std::to_string(chunk_end) + " beyond " +
                                std::to_string(kv_size_) + " positions");
    }
    const uint32_t L           = params_.local_window;
    const uint32_t H           = params_.heavy_budget;
    const uint32_t M           = params_.memory_size();
    const uint32_t local_start = chunk_end > L ? chunk_end - L : 0;
    const uint32_t chunk_start = state_.chunk_boundaries.back();
    // candidates below the window: the previous memory set's (below the chunk, so that none
    // is counted twice) and the chunk's own
    const uint32_t old_end     = std::min(chunk_start, local_start);
    const uint32_t new_end     = local_start;

    const uint16_t * scores = scores_[il].data();
    int32_t *        mem    = memory_[il].data();
    auto             value  = [](float s) { return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s; };
    auto             higher = [](const candidate & a, const candidate & b) {
        return a.score != b.score ? a.score > b.score : a.pos < b.pos;
    };

    for (uint32_t h = 0; h < n_head_; ++h) {
        const uint16_t * head_scores = scores + (size_t) h * kv_size_;
        int32_t *        head_mem    = mem + (size_t) h * M;

        candidates_.clear();
        if (memory_initialized_) {
            for (uint32_t slot = 0; slot < M && head_mem[slot] != EMPTY; ++slot) {
                const uint32_t pos = (uint32_t) head_mem[slot];
                if (pos < old_end) {
                    candidates_.push_back({ value(llama_h2o_bf16_to_fp32(head_scores[pos])), (int32_t) pos });
                }
            }
        }
        for (uint32_t pos = chunk_start; pos < new_end; ++pos) {
            candidates_.push_back({ value(llama_h2o_bf16_to_fp32(head_scores[pos])), (int32_t) pos });
        }
        if (candidates_.size() > H) {
            std::nth_element(candidates_.begin(), candidates_.begin() + H, candidates_.end(), higher);
            candidates_.resize(H);
        }

        // heavy hitters lie below the window: sorted, they come first, the window after them
        selected_.clear();
        for (const candidate & c : candidates_) {
            selected_.push_back(c.pos);
        }
        std::sort(selected_.begin(), selected_.end());
        for (uint32_t pos = local_start; pos < chunk_end; ++pos) {
            selected_.push_back((int32_t) pos);
        }
        std::copy(selected_.begin(), selected_.end(), head_mem);
        std::fill(head_mem + selected_.size(), head_mem + M, EMPTY);
    }
    memory_initialized_ = true;
}

uint64_t llama_h2o::memory_count(uint32_t il) const {
    check_layer(il);
    return (uint64_t) std::count_if(memory_[il].begin(), memory_[il].end(), [](int32_t p) { return p != EMPTY; });
}

void llama_h2o::next_chunk(uint32_t chunk_len) {
    state_.tokens_processed += chunk_len;
    state_.chunk_idx++;
    state_.chunk_boundaries.push_back(state_.tokens_processed);
}

void llama_h2o::subset(uint32_t il, uint32_t n_tokens, llama_h2o_subset & out) const {
    check_layer(il);
    const uint32_t  M   = params_.memory_size();
    const int32_t * mem = memory_[il].data();
    // a memory set fills its slots from the first: its size is the index of the first empty one
    auto size_of = [&](uint32_t h) {
        return (uint32_t) (std::find(mem + (size_t) h * M, mem + (size_t) (h + 1) * M, EMPTY) - (mem + (size_t) h * M));
    };
    out.n_mem = n_head_ > 0 ? size_of(0) : 0;
    out.pos.clear();
    for (uint32_t h = 0; h < n_head_; ++h) {
        // every head has as many candidates (build_memory_set's heavy hitters lie below the earlier
        // window's start) and the same window: one mask serves all heads
        if (size_of(h) != out.n_mem) {
            throw std::logic_error("H2O: the heads of layer " + std::to_string(il) +
                                   " have memory sets of different sizes (a broken invariant of build_memory_set)");
        }
        out.pos.insert(out.pos.end(), mem + (size_t) h * M, mem + (size_t) h * M + out.n_mem);
    }
    out.n_tokens = n_tokens;
}

void llama_h2o::update_layer(uint32_t il, const llama_h2o_subset & sub, const float * colsum) {
    check_layer(il);
    const uint32_t  M           = params_.memory_size();
    const uint32_t  chunk_start = state_.chunk_boundaries.back();
    const size_t    n_keys      = sub.n_keys();
    const int32_t * mem         = memory_[il].data();
    auto          stale       = [&] {
        return std::invalid_argument("H2O: the subset does not hold layer " + std::to_string(il) +
                                     "'s memory set (built for another chunk?)");
    };
    if (sub.n_mem > M || sub.pos.size() != (size_t) n_head_ * sub.n_mem) {
        throw stale();
    }
    inter_.assign((size_t) n_head_ * M, 0.0f);
    intra_.resize((size_t) n_head_ * sub.n_tokens);
    for (uint32_t h = 0; h < n_head_; ++h) {
        const float *   head_sums = colsum + (size_t) h * n_keys;
        const int32_t * head_mem  = mem + (size_t) h * M;
        const int32_t * head_pos  = sub.pos.data() + (size_t) h * sub.n_mem;
        if (!std::equal(head_pos, head_pos + sub.n_mem, head_mem) || (sub.n_mem < M && head_mem[sub.n_mem] != EMPTY)) {
            throw stale();
        }
        std::copy(head_sums, head_sums + sub.n_mem, inter_.begin() + (size_t) h * M);
        std::copy(head_sums + sub.n_mem, head_sums + n_keys, intra_.begin() + (size_t) h * sub.n_tokens);
    }
    if (memory_initialized_) {
        accumulate_memory_scores(il, inter_.data());
    }
    init_chunk_scores(il, chunk_start, sub.n_tokens, intra_.data());
    build_memory_set(il, chunk_start + sub.n_tokens);
}

void llama_h2o::reset() {
    for (auto & s : scores_) {
        s.clear();
    }
    for (auto & m : memory_) {
        std::fill(m.begin(), m.end(), EMPTY);
    }
    state_              = llama_h2o_chunk_state();
    memory_initialized_ = false;
}

llama_h2o_layout llama_h2o::scores_layout() const {
    return { { kv_size_, n_head_ }, { sizeof(uint16_t), sizeof(uint16_t) * kv_size_ } };
}

llama_h2o_layout llama_h2o::memory_layout() const {
    const uint32_t m = params_.memory_size();
    return { { m, n_head_ }, { sizeof(int32_t), sizeof(int32_t) * m } };
}

size_t llama_h2o::bytes() const {
    size_t total = 0;
    for (size_t il = 0; il < scores_.size(); ++il) {
        total += scores_[il].size() * sizeof(uint16_t) + memory_[il].size() * sizeof(int32_t);
    }
    return total;
}

double llama_h2o_score_overhead(uint32_t n_layer_h2o, uint32_t n_head, uint32_t n_layer_kv, uint32_t n_head_kv,
                                uint32_t head_dim) {
    const double score_bytes = (double) n_layer_h2o * n_head * sizeof(uint16_t);
    const double kv_bytes    = (double) n_layer_kv * 2.0 * n_head_kv * head_dim * sizeof(uint16_t);
    return score_bytes / kv_bytes;
}
