#include "kv/history-diff.h"

#include "kv/block-hash.h"

#include <algorithm>
#include <unordered_map>

llama_opt_diff_engine::llama_opt_diff_engine(uint32_t block_size, uint32_t min_unchanged)
    : block_size_(block_size), min_unchanged_(std::max(1u, min_unchanged)) {
    if (block_size == 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "block_size must be at least 1", "block_size");
    }
}

// A block found in more places of prev than this anchors nothing: a run of repeated text would
// give quadratically many candidate runs (difflib's "popular" elements, likewise).
static constexpr size_t DIFF_MAX_BLOCK_REPEATS = 16;

namespace {
struct diff_run {
    uint32_t p, c, n;  // prev[p, p + n) == curr[c, c + n)
};
}  // namespace

void llama_opt_diff_engine::match_blocks(const llama_token * prev, uint32_t p0, uint32_t p1,
                                         const llama_token * curr, uint32_t c0, uint32_t c1,
                                         llama_opt_diff_result & keeps) const {
    const uint32_t B = block_size_;
    if (p1 - p0 < B || c1 - c0 < B) {
        return;
    }
    // prev's blocks by content; each found again in curr anchors the run of equal tokens on its
    // diagonal (p - c), extended both ways as far as the tokens agree
    std::unordered_multimap<uint64_t, uint32_t> blocks;
    for (uint32_t p = p0; p + B <= p1; p += B) {
        blocks.emplace(llama_opt_hash_block(prev + p, B), p);
    }
    work_ += p1 - p0;
    std::vector<diff_run>                  runs;
    std::unordered_map<int64_t, uint32_t> diagonal_end;  // curr end of the last run found on a diagonal
    for (uint32_t c = c0; c + B <= c1; ++c) {
        work_ += B;
        const uint64_t h = llama_opt_hash_block(curr + c, B);
        if (blocks.count(h) > DIFF_MAX_BLOCK_REPEATS) {
            continue;
        }
        const auto range = blocks.equal_range(h);
        for (auto it = range.first; it != range.second; ++it) {
            const uint32_t p    = it->second;
            const int64_t  diag = (int64_t) p - c;
            const auto     seen = diagonal_end.find(diag);
            if ((seen != diagonal_end.end() && c < seen->second) || !std::equal(prev + p, prev + p + B, curr + c)) {
                continue;  // inside a run found already, or a hash collision
            }
            uint32_t ps = p, cs = c;
            while (ps > p0 && cs > c0 && prev[ps - 1] == curr[cs - 1]) {
                --ps;
                --cs;
            }
            uint32_t n = (c - cs) + B;
            while (ps + n < p1 && cs + n < c1 && prev[ps + n] == curr[cs + n]) {
                ++n;
            }
            runs.push_back({ ps, cs, n });
            diagonal_end[diag] = cs + n;
            work_ += n;
        }
    }
    // Longest run first, then the same in the windows before and after it, as difflib does: the
    // first block matched is not always the right one (text that also occurs far ahead, such as
    // a file quoted again in a later tool result, would pull the match past the nearer runs).
    struct window {
        uint32_t              p0, p1, c0, c1;
        std::vector<uint32_t> runs;  // indices of the runs that reach into it
    };
    std::vector<window> todo(1, window{ p0, p1, c0, c1, {} });
    for (uint32_t i = 0; i < runs.size(); ++i) {
        todo[0].runs.push_back(i);
    }
    const size_t first_keep = keeps.size();
    while (!todo.empty()) {
        const window w = std::move(todo.back());
        todo.pop_back();
        // the longest run clipped to the window; ties: the earliest in curr, then in prev
        diff_run best{ 0, 0, 0 };
        for (uint32_t i : w.runs) {
            const diff_run & r  = runs[i];
            const int64_t    lo = std::max<int64_t>({ 0, (int64_t) w.p0 - r.p, (int64_t) w.c0 - r.c });
            const int64_t    hi = std::min<int64_t>({ (int64_t) r.n, (int64_t) w.p1 - r.p, (int64_t) w.c1 - r.c });
            const diff_run   clipped{ (uint32_t) (r.p + lo), (uint32_t) (r.c + lo), (uint32_t) std::max<int64_t>(0, hi - lo) };
            if (clipped.n > best.n || (clipped.n == best.n && clipped.n > 0 &&
                                       (clipped.c < best.c || (clipped.c == best.c && clipped.p < best.p)))) {
                best = clipped;
            }
        }
        work_ += w.runs.size();
        if (best.n == 0) {
            continue;
        }
        keeps.push_back({ DIFF_KEEP, best.p, best.n, best.c, best.n });
        window before{ w.p0, best.p, w.c0, best.c, {} };
        window after{ best.p + best.n, w.p1, best.c + best.n, w.c1, {} };
        for (uint32_t i : w.runs) {
            const diff_run & r = runs[i];
            if (r.p < before.p1 && r.c < before.c1) {
                before.runs.push_back(i);
            }
            if (r.p + r.n > after.p0 && r.c + r.n > after.c0) {
                after.runs.push_back(i);
            }
        }
        todo.push_back(std::move(before));
        todo.push_back(std::move(after));
    }
    std::sort(keeps.begin() + (std::ptrdiff_t) first_keep, keeps.end(),
              [](const llama_opt_diff_span & a, const llama_opt_diff_span & b) { return a.curr_start < b.curr_start; });
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
