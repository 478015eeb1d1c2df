#include "session/attn-prune.h"

#include <algorithm>
#include <chrono>
#include <climits>

void llama_opt_session_attn_prune::forget_from(size_t pos) {
    const size_t B = history_.ctx().block_size();
    for (auto it = cold_.begin(); it != cold_.end();) {
        it = (it->first + 1) * B > pos ? cold_.erase(it) : std::next(it);
    }
    pruner_.truncate(pos / B);
}

void llama_opt_session_attn_prune::forget_span(size_t p0, size_t p1) {
    const size_t B = history_.ctx().block_size();
    for (auto it = cold_.begin(); it != cold_.end();) {
        it = it->first * B < p1 && (it->first + 1) * B > p0 ? cold_.erase(it) : std::next(it);
    }
}

// The keys of the live positions, then those of the cold blocks (in block order).
static void read_keys(const llama_opt_session_history & history, const llama_opt_attn_capture & capture,
                      const std::map<size_t, std::vector<uint8_t>> & cold, llama_opt_attn_keys & keys) {
    constexpr size_t       chunk  = 256;  // positions per read: bounded scratch memory
    const size_t           stride = capture.row_stride();
    std::vector<uint8_t>   rows(chunk * stride);
    std::vector<llama_pos> pos;
    auto add = [&](size_t p0, size_t n, const uint8_t * r) {
        pos.resize(n);
        for (size_t i = 0; i < n; ++i) {
            pos[i] = (llama_pos) (p0 + i);
        }
        keys.add(capture, pos.data(), n, r, stride);
    };
    for (const llama_opt_span & s : history.live_ranges()) {
        for (size_t a = s.first; a < s.second; a += chunk) {
            const size_t b = std::min(s.second, a + chunk);
            if (!history.ctx().memory().read(history.seq(), a, b, rows.data())) {
                throw llama_opt_error(llama_opt_errc::decode_failed,
                    "attention scores: the KV rows of positions " + std::to_string(a) + ".." + std::to_string(b) +
                    " could not be read");
            }
            add(a, b - a, rows.data());
        }
    }
    const size_t B = history.ctx().block_size();
    for (const auto & c : cold) {
        add(c.first * B, B, c.second.data());
    }
}

llama_opt_attn_probe llama_opt_session_attn_prune::probe() const {
    const llama_opt_attn_capture * capture = history_.ctx().attn_capture();
    if (!capture || !capture->available()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            capture ? "attention scores are not available for this model's KV cache layout (F16 K rows expected)"
                    : "attention scores need a context made with attn_prune_enabled (the model's queries are "
                      "observed through the eval callback, which is set when the context is made)",
            "attn_prune_enabled");
    }
    const size_t         n_evaluated = history_.n_evaluated();
    llama_opt_attn_probe probe;
    llama_opt_attn_keys  keys;
    read_keys(history_, *capture, {}, keys);
    probe.shape  = capture->shape();
    probe.layers = capture->layers();
    for (uint32_t r = 0; r < capture->n_rows(); ++r) {
        probe.q_pos.push_back((llama_pos) (n_evaluated - capture->n_rows() + r));
    }
    for (size_t i = 0; i < probe.layers.size(); ++i) {
        probe.q.insert(probe.q.end(), capture->queries(i).begin(), capture->queries(i).end());
        probe.k.insert(probe.k.end(), keys.k[i].begin(), keys.k[i].end());
    }
    probe.k_pos  = keys.pos;
    probe.scores = llama_opt_attn_score(*capture, keys, n_evaluated);
    return probe;
}

bool llama_opt_session_attn_prune::restore_block(size_t block) {
    const size_t B  = history_.ctx().block_size();
    auto         it = cold_.find(block);
    if (it == cold_.end() || !history_.ctx().memory().write(history_.seq(), block * B, (block + 1) * B, it->second.data())) {
        return false;  // no room where the placement needs it: the block stays cold
    }
    cold_.erase(it);
    history_.refill(block * B, (block + 1) * B);
    pruner_.set_evicted((uint32_t) block, false);
    counters_.count(&llama_opt_stats::attn_blocks_restored, 1);
    counters_.count(&llama_opt_stats::attn_tokens_restored, B);
    return true;
}

void llama_opt_session_attn_prune::prune_turn(size_t turn_begin, size_t system_end) {
    const auto                     t0      = std::chrono::steady_clock::now();
    const llama_opt_config &       cfg     = approx_.get();
    llama_opt_context &            ctx     = history_.ctx();
    const llama_opt_attn_capture & capture = *ctx.attn_capture();
    const size_t                   B       = ctx.block_size();
    const size_t                   end     = history_.n_evaluated();
    if (capture.n_rows() == 0 || end < B) {
        return;
    }
    pruner_.set_limits(cfg.attn_prune_threshold, cfg.attn_prune_window);
    llama_opt_attn_keys keys;
    read_keys(history_, capture, cold_, keys);
    const std::vector<float> scores = llama_opt_attn_score(capture, keys, end);
    counters_.count(&llama_opt_stats::attn_keys_scored, keys.pos.size());

    // attention mass per block; a block is live if none of it is in a hole
    const size_t       n_blocks = (end + B - 1) / B;
    std::vector<float> mass(n_blocks, 0.0f);
    for (size_t i = 0; i < keys.pos.size(); ++i) {
        mass[keys.pos[i] / B] += scores[i];
    }
    // guarded: the first block (attention sinks) and the system prompt; the current turn and the
    // most recent tokens
    const size_t first  = std::max<size_t>(1, (system_end + B - 1) / B);
    const size_t recent = end > cfg.attn_prune_recent ? end - cfg.attn_prune_recent : 0;
    const size_t last   = std::min(recent, turn_begin) / B;
    auto whole_live = [&](size_t b) {
        return !cold_.count(b) && std::none_of(history_.holes().begin(), history_.holes().end(), [&](const llama_opt_span & h) {
            return h.first < (b + 1) * B && h.second > b * B;
        });
    };
    float weakest = 1.0f;  // the least attended block that stays
    for (size_t b = first; b < last; ++b) {
        if (whole_live(b)) {
            weakest = std::min(weakest, mass[b]);
        }
    }
    // restore: cold blocks the turn attends to as much as to a kept one (strongest first)
    std::vector<size_t> cold_blocks;
    for (const auto & c : cold_) {
        cold_blocks.push_back(c.first);
    }
    std::sort(cold_blocks.begin(), cold_blocks.end(), [&](size_t a, size_t b) { return mass[a] > mass[b]; });
    bool restored = false;
    for (size_t b : cold_blocks) {
        if (mass[b] >= std::max(cfg.attn_prune_threshold, weakest) && restore_block(b)) {
            restored = true;
        }
    }
    if (restored) {  // the turn's tokens computed again, now seeing the restored blocks
        history_.drop_kv_from(turn_begin);
        prefill_.prefill(&llama_opt_stats::tokens_prefilled);
        counters_.count(&llama_opt_stats::attn_tokens_recomputed, end - turn_begin);
    }
    std::vector<float> live_mass(mass);
    for (const auto & c : cold_) {
        live_mass[c.first] = 0.0f;  // not attended: cold (update() leaves evicted blocks alone)
    }
    pruner_.update(live_mass);

    size_t budget = SIZE_MAX;  // blocks of [first, last) that may stay
    if (cfg.attn_prune_budget > 0.0f) {
        size_t live_total = 0, live_eligible = 0;
        for (const llama_opt_span & s : history_.live_ranges()) {
            live_total += s.second - s.first;
        }
        for (size_t b = first; b < last; ++b) {
            live_eligible += whole_live(b) ? B : 0;
        }
        const size_t allowed = (size_t) (cfg.attn_prune_budget * (double) end);
        const size_t outside = live_total - live_eligible;
        budget               = allowed > outside ? (allowed - outside) / B : 0;
    }
    const size_t stride = capture.row_stride();
    for (uint32_t b : pruner_.eviction_candidates(first, last, budget)) {
        if (!whole_live(b)) {
            continue;
        }
        std::vector<uint8_t> rows(B * stride);
        if (!ctx.memory().read(history_.seq(), b * B, (b + 1) * B, rows.data())) {
            continue;
        }
        cold_[b] = std::move(rows);
        history_.drop_kv(b * B, (b + 1) * B);
        pruner_.set_evicted(b, true);
        counters_.count(&llama_opt_stats::attn_blocks_pruned, 1);
        counters_.count(&llama_opt_stats::attn_tokens_pruned, B);
    }
    counters_.count(&llama_opt_stats::attn_score_us,
        (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}
