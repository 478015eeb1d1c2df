#include "llama-kv-cache-diff.h"

#include "llama-context-hash.h"

#include <algorithm>
#include <unordered_map>

llama_opt_diff_engine::llama_opt_diff_engine(uint32_t block_size, uint32_t min_unchanged)
    : block_size_(block_size), min_unchanged_(std::max(1u, min_unchanged)) {
    if (block_size == 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "block_size must be at least 1", "block_size");
    }
}

void llama_opt_diff_engine::match_blocks(const llama_token * prev, uint32_t p0, uint32_t p1,
                                         const llama_token * curr, uint32_t c0, uint32_t c1,
                                         llama_opt_diff_result & keeps) const {
    const uint32_t B = block_size_;
    if (p1 - p0 < B || c1 - c0 < B) {
        return;
    }
    // prev's blocks by content; each found again in curr anchors a KEEP span
    std::unordered_multimap<uint64_t, uint32_t> blocks;
    for (uint32_t p = p0; p + B <= p1; p += B) {
        blocks.emplace(llama_opt_hash_block(prev + p, B), p);
    }
    work_ += p1 - p0;
    uint32_t prev_done = p0;  // matches must increase in both histories
    uint32_t curr_done = c0;
    for (uint32_t c = c0; c + B <= c1;) {
        work_ += B;
        const auto range = blocks.equal_range(llama_opt_hash_block(curr + c, B));
        uint32_t   found = UINT32_MAX;
        for (auto it = range.first; it != range.second; ++it) {
            const uint32_t p = it->second;
            if (p >= prev_done && p < found && std::equal(prev + p, prev + p + B, curr + c)) {
                found = p;  // the earliest one keeps the most of prev available
            }
        }
        if (found == UINT32_MAX) {
            ++c;
            continue;
        }
        // refine to token boundaries: extend backwards into the gap, then forwards
        uint32_t p = found, cs = c;
        while (p > prev_done && cs > curr_done && prev[p - 1] == curr[cs - 1]) {
            --p;
            --cs;
        }
        uint32_t n = (c - cs) + B;
        while (p + n < p1 && cs + n < c1 && prev[p + n] == curr[cs + n]) {
            ++n;
        }
        keeps.push_back({ DIFF_KEEP, p, n, cs, n });
        work_ += n;
        prev_done = p + n;
        curr_done = cs + n;
        c         = curr_done;
    }
}

llama_opt_diff_result llama_opt_diff_engine::compute(const llama_token * prev, uint32_t n_prev,
                                                     const llama_token * curr, uint32_t n_curr) const {
    // common prefix and suffix: the whole answer for appends and single edits
    work_ = 0;
    uint32_t prefix = 0;
    while (prefix < n_prev && prefix < n_curr && prev[prefix] == curr[prefix]) {
        ++prefix;
    }
    uint32_t suffix = 0;
    while (suffix < n_prev - prefix && suffix < n_curr - prefix &&
           prev[n_prev - 1 - suffix] == curr[n_curr - 1 - suffix]) {
        ++suffix;
    }

    llama_opt_diff_result keeps;
    if (prefix > 0) {
        keeps.push_back({ DIFF_KEEP, 0, prefix, 0, prefix });
    }
    work_ += prefix + suffix;
    match_blocks(prev, prefix, n_prev - suffix, curr, prefix, n_curr - suffix, keeps);
    if (suffix > 0) {
        keeps.push_back({ DIFF_KEEP, n_prev - suffix, suffix, n_curr - suffix, suffix });
    }

    // short KEEP spans after the prefix are not worth keeping
    keeps.erase(std::remove_if(keeps.begin(), keeps.end(), [&](const llama_opt_diff_span & s) {
        return s.prev_start > 0 && s.prev_length < min_unchanged_;
    }), keeps.end());

    // the gaps between KEEP spans become INSERT / DELETE / REPLACE
    llama_opt_diff_result result;
    uint32_t p = 0, c = 0;
    auto gap = [&](uint32_t p_end, uint32_t c_end) {
        const uint32_t np = p_end - p, nc = c_end - c;
        if (np > 0 || nc > 0) {
            const llama_opt_diff_op op = np == 0 ? DIFF_INSERT : nc == 0 ? DIFF_DELETE : DIFF_REPLACE;
            result.push_back({ op, p, np, c, nc });
        }
    };
    for (const auto & k : keeps) {
        gap(k.prev_start, k.curr_start);
        result.push_back(k);
        p = k.prev_start + k.prev_length;
        c = k.curr_start + k.curr_length;
    }
    gap(n_prev, n_curr);
    return result;
}

uint32_t llama_opt_diff_common_prefix(const llama_opt_diff_result & diff) {
    return !diff.empty() && diff[0].op == DIFF_KEEP && diff[0].prev_start == 0 && diff[0].curr_start == 0
        ? diff[0].prev_length : 0;
}

uint32_t llama_opt_diff_kept(const llama_opt_diff_result & diff) {
    uint32_t n = 0;
    for (const auto & s : diff) {
        n += s.op == DIFF_KEEP ? s.prev_length : 0;
    }
    return n;
}

void llama_opt_context_history::record(const llama_token * tokens, uint32_t n_tokens) {
    prev_.swap(curr_);
    curr_.assign(tokens, tokens + n_tokens);
    has_prev_ = has_curr_;
    has_curr_ = true;
}

void llama_opt_context_history::clear() {
    prev_.clear();
    curr_.clear();
    has_prev_ = has_curr_ = false;
}
