#include "session/reuse.h"

#include "kv/block-hash.h"
#include "engine/log.h"

#include <algorithm>
#include <chrono>

// how long save() waits for the session's jobs queued for the background writer
static constexpr double SAVE_FLUSH_S = 60;
// how long a lookup waits for a queued job that holds more of its prompt than the disk does
static constexpr double LOOKUP_FLUSH_S = 5;

void llama_opt_session_reuse::adopt_shared_prefix() {
    llama_opt_context &    ctx  = history_.ctx();
    const int32_t          seq  = history_.seq();
    llama_opt_block_pool * pool = ctx.memory().pool();
    const uint32_t B = ctx.block_size();
    const size_t shareable = llama_opt_reusable_prefix(history_.size(), ctx) / B;
    const size_t own       = history_.n_canonical() / B;  // complete blocks of our own
    if (shareable * B <= history_.n_canonical()) {
        return;
    }
    counters_.count(&llama_opt_stats::dedup_blocks_total, shareable - own);

    // walk the pool along this history; a holder of block k holds every block before it
    std::vector<const llama_opt_kv_block *> path;
    uint64_t chain = LLAMA_OPT_CHAIN_ROOT, parent = 0;
    for (size_t k = 0; k < shareable; ++k) {
        const llama_token * t = history_.tokens().data() + k * B;
        chain = ctx.memory().block_hash(chain, t);
        const llama_opt_kv_block * b = pool->lookup(chain, parent, t, B);
        if (!b || std::none_of(b->holders.begin(), b->holders.end(), [&](int32_t h) { return h != seq; })) {
            break;
        }
        path.push_back(b);
        parent = b->id;
    }
    if (path.size() * B <= history_.n_canonical()) {
        return;
    }
    // take the whole prefix from one holder, so that our cells stay in position order
    int32_t holder = -1;
    for (int32_t h : path.back()->holders) {
        if (h != seq) {
            holder = h;
            break;
        }
    }
    const size_t n_shared = path.size() * B;
    const size_t saved    = n_shared - std::min(n_shared, history_.n_canonical());
    history_.drop_kv_from(0);
    ctx.memory().share(holder, seq, 0, n_shared);
    std::vector<uint64_t> hashes;
    for (const llama_opt_kv_block * b : path) {
        ctx.memory().hold_block(seq, b);
        hashes.push_back(b->hash);
    }
    counters_.count(&llama_opt_stats::dedup_blocks_hit, path.size() - std::min(path.size(), own));
    counters_.count(&llama_opt_stats::dedup_tokens_saved, saved);
    history_.adopt_blocks(hashes);
    if (ctx.memory().write_behind()) {  // the holder wrote them behind, most likely: not snapshotted again
        const std::vector<uint64_t> chain = persist_chain(path.size());
        known_on_disk(chain, ctx.memory().persist()->find(ctx.memory().persist_layout(), chain,
                                                          history_.tokens().data(), path.size()).n_blocks);
    }
}

void llama_opt_session_reuse::computed_canonically(size_t end) {
    history_.computed_canonically(end);
    register_blocks();
    write_behind();
}

void llama_opt_session_reuse::register_blocks() {
    llama_opt_context &    ctx  = history_.ctx();
    const int32_t          seq  = history_.seq();
    const uint32_t         B    = ctx.block_size();
    llama_opt_block_pool * pool = ctx.memory().pool();
    for (size_t k = history_.hash_new_blocks(); k < history_.chain().size(); ++k) {
        const llama_token * t = history_.tokens().data() + k * B;
        const std::vector<uint64_t> & held = ctx.memory().held_blocks(seq);
        if (pool && held.size() == k) {  // a block can be pooled only after its parent
            const llama_opt_kv_block * b =
                ctx.memory().pool_insert(seq, history_.chain()[k], k == 0 ? 0 : held[k - 1], (uint32_t) k, t);
            if (b) {
                const bool duplicate = !b->holders.empty();  // another sequence computed it too
                ctx.memory().hold_block(seq, b);
                if (duplicate && ctx.settings().config.canon_enabled) {
                    share_duplicate(k, b);
                }
            }
        }
    }
}

// A block we computed although another sequence holds it (the last chunk must hold
// min_chunk() tokens, so a session whose own suffix is short computes the end of a shared
// prefix again). Its values are bitwise those of the other copy (canonical schedule), so we
// drop ours and share theirs, if their cells keep ours in position order (patches/0004).
void llama_opt_session_reuse::share_duplicate(size_t k, const llama_opt_kv_block * b) {
    llama_opt_context & ctx   = history_.ctx();
    const int32_t       seq   = history_.seq();
    const size_t        B     = ctx.block_size();
    const size_t        start = k * B;
    const int32_t below = k == 0 ? -1 : ctx.memory().cell(seq, start - 1);
    const int32_t above = ctx.memory().cell(seq, start + B);
    counters_.count(&llama_opt_stats::canon_entries_total, 1);
    for (int32_t holder : b->holders) {
        if (holder == seq) {
            continue;
        }
        const int32_t first = ctx.memory().cell(holder, start);
        const int32_t last  = ctx.memory().cell(holder, start + B - 1);
        if (first > below && last >= first && (above < 0 || last < above)) {
            ctx.memory().remove(seq, (llama_pos) start, (llama_pos) (start + B));
            ctx.memory().share(holder, seq, start, start + B);
            counters_.count(&llama_opt_stats::canon_entries_deduped, 1);
            counters_.count(&llama_opt_stats::canon_bytes_saved, (uint64_t) B * ctx.kv_bytes_per_token());
            return;
        }
    }
}

void llama_opt_session_reuse::share_blocks_with(int32_t fork_seq) const {
    llama_opt_context & ctx = history_.ctx();
    if (llama_opt_block_pool * pool = ctx.memory().pool()) {
        for (uint64_t id : ctx.memory().held_blocks(history_.seq())) {
            ctx.memory().hold_block(fork_seq, pool->find(id));
        }
    }
}

std::vector<uint64_t> llama_opt_session_reuse::persist_chain(size_t n_blocks) const {
    const uint32_t B = history_.ctx().block_size();
    std::vector<uint64_t> chain;
    for (size_t k = 0; k < n_blocks; ++k) {
        chain.push_back(
            llama_opt_hash_chain(k == 0 ? LLAMA_OPT_CHAIN_ROOT : chain.back(), history_.tokens().data() + k * B, B));
    }
    return chain;
}

void llama_opt_session_reuse::known_on_disk(const std::vector<uint64_t> & chain, size_t n) {
    const size_t common = std::mismatch(on_disk_.begin(), on_disk_.begin() + std::min(on_disk_.size(), n), chain.begin()).first -
                          on_disk_.begin();
    if (common < n) {
        on_disk_.assign(chain.begin(), chain.begin() + n);
    }
}

void llama_opt_session_reuse::save_on_leaving() {
    try {
        if (history_.ctx().memory().write_behind()) {
            write_behind();
        } else {
            save();
        }
    } catch (const std::exception &) {
        counters_.count(&llama_opt_stats::persist_errors, 1);
    }
}

void llama_opt_session_reuse::write_behind() {
    llama_opt_context &              ctx    = history_.ctx();
    llama_opt_persist_write_behind * writer = ctx.memory().write_behind();
    if (!writer) {
        return;
    }
    if (account_->lost.exchange(false)) {  // a job was dropped or failed: start again from what is there
        on_disk_.resize(std::min<size_t>(on_disk_.size(), account_->blocks_on_disk));
    }
    const uint32_t B        = ctx.block_size();
    const size_t   n_blocks = history_.n_canonical() / B;  // exact KV only
    const std::vector<uint64_t> chain = persist_chain(n_blocks);
    const size_t first_new = std::mismatch(chain.begin(), chain.begin() + std::min(n_blocks, on_disk_.size()), on_disk_.begin()).first -
                             chain.begin();
    if (first_new == n_blocks) {
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    llama_opt_persist_job job;
    job.rows.resize((n_blocks - first_new) * B * ctx.memory().persist_layout().bytes_per_token);
    if (!ctx.memory().read(history_.seq(), first_new * B, n_blocks * B, job.rows.data())) {
        counters_.count(&llama_opt_stats::persist_errors, 1);  // (not expected: canonical blocks have their KV)
        return;
    }
    job.account   = account_;
    job.tokens.assign(history_.tokens().begin(), history_.tokens().begin() + n_blocks * B);
    job.chain     = chain;
    job.first_new = (uint32_t) first_new;
    on_disk_      = chain;
    writer->submit(std::move(job));  // dropped: account_->lost says so next time
    counters_.count(&llama_opt_stats::persist_snapshot_us,
                    (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}

void llama_opt_session_reuse::cancel_write_behind() const {
    if (llama_opt_persist_write_behind * writer = history_.ctx().memory().write_behind()) {
        writer->cancel(account_.get());
    }
}

size_t llama_opt_session_reuse::save() {
    llama_opt_context &              ctx    = history_.ctx();
    llama_opt_persist_store *        store  = ctx.memory().persist();
    const llama_opt_persist_layout & layout = ctx.memory().persist_layout();
    const std::vector<llama_token> & tokens = history_.tokens();
    const uint32_t B        = ctx.block_size();
    const size_t   n_blocks = history_.n_canonical() / B;  // exact KV only (approximate KV starts later)
    if (n_blocks == 0) {
        return 0;
    }
    if (llama_opt_persist_write_behind * writer = ctx.memory().write_behind()) {
        writer->flush(SAVE_FLUSH_S, account_.get());  // what it queued first: then this finds it stored
    }
    const size_t n = n_blocks * B;
    const std::vector<uint64_t> chain = persist_chain(n_blocks);
    const llama_opt_persist_store::match stored = store->find(layout, chain, tokens.data(), n_blocks);
    if (stored.n_blocks == n_blocks) {
        store->touch(stored.entry.path);  // used again: the last to go when the store is cleaned
        known_on_disk(chain, n_blocks);
        return n;  // stored already (maybe within a longer context)
    }
    std::vector<uint8_t> rows(n * layout.bytes_per_token);
    std::string why;
    if (!ctx.memory().read(history_.seq(), 0, n, rows.data())) {
        why = "the KV of the history is not all in the cache";
    } else if (store->save(layout, std::vector<llama_token>(tokens.begin(), tokens.begin() + n), chain, rows.data(), why,
                           (uint64_t) ctx.settings().config.persist_max_mb << 20)) {
        counters_.count(&llama_opt_stats::persist_saves, 1);
        store->saved();
        counters_.count(&llama_opt_stats::persist_bytes_written, llama_opt_persist_file_size(layout, n_blocks));
        known_on_disk(chain, n_blocks);
        return n;
    }
    counters_.count(&llama_opt_stats::persist_errors, 1);
    if (store->first_failure()) {
        llama_opt_log_warn("pyllamaopt: could not save the KV of a session: " + why + " (saves that fail are counted "
                           "in persist_errors, not logged again until one succeeds; requests go on without)");
    }
    return 0;
}

// The disk tier after the RAM tier: blocks of a stored context that holds a longer prefix of
// this history than the session has are read back into its cells, bit for bit (the canonical
// schedule makes them equal to computing them here).
void llama_opt_session_reuse::restore_from_disk(size_t end) {
    llama_opt_context &       ctx   = history_.ctx();
    llama_opt_persist_store * store = ctx.memory().persist();
    if (!store) {
        return;
    }
    const llama_opt_persist_layout & layout = ctx.memory().persist_layout();
    const uint32_t B    = ctx.block_size();
    const size_t   want = llama_opt_reusable_prefix(end, ctx) / B;  // the last chunk is computed here
    const size_t   own  = history_.n_canonical() / B;
    if (want <= own) {
        return;
    }
    const std::vector<uint64_t> chain = persist_chain(want);
    if (llama_opt_persist_write_behind * writer = ctx.memory().write_behind()) {
        writer->flush_holding(chain, own, LOOKUP_FLUSH_S);  // queued, not yet written: a write beats computing
    }
    const llama_opt_persist_store::match m = store->find(layout, chain, history_.tokens().data(), want);
    known_on_disk(chain, m.n_blocks);  // (not written behind again)
    if (m.n_blocks <= own) {
        if (m.miss == llama_opt_persist_miss::incompatible) {
            counters_.count(&llama_opt_stats::persist_misses_incompatible, 1);
        } else if (m.n_blocks == 0) {
            counters_.count(&llama_opt_stats::persist_misses, 1);
        }
        return;
    }
    history_.drop_kv_from(own * B);
    const size_t piece = 16;  // blocks read and written at a time: bounded memory
    std::vector<uint8_t> rows(piece * B * layout.bytes_per_token);
    size_t k = own;
    while (k < m.n_blocks) {
        const uint32_t last = (uint32_t) std::min(k + piece, (size_t) m.n_blocks);
        std::string why;
        llama_opt_persist_miss miss;
        const uint32_t got = store->load(m.entry, (uint32_t) k, last, rows.data(), why, miss);
        // room as computing the prompt would find it (idle sessions evicted): restoring is cheaper
        if (!ctx.memory().write(history_.seq(), k * B, (k + got) * B, rows.data(), /* evict_sessions */ true)) {
            break;  // no room: the rest is computed (and may relocate)
        }
        k += got;
        if (k < last) {
            if (miss == llama_opt_persist_miss::corrupt) {
                counters_.count(&llama_opt_stats::persist_misses_corrupt, 1);
                llama_opt_log_warn("pyllamaopt: removed a corrupt KV cache entry: " + why);
                // blocks read from that entry before the bad one are no longer on disk: written again
                on_disk_.resize(std::min(on_disk_.size(), (size_t) store->find(layout, chain, history_.tokens().data(), want).n_blocks));
            }
            break;
        }
    }
    if (k > own) {
        history_.restored(k * B);
        register_blocks();
        counters_.count(&llama_opt_stats::persist_loads, 1);
        counters_.count(&llama_opt_stats::persist_tokens_restored, (k - own) * B);
    }
}
