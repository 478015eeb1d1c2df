// kv/disk-writer, the disk tier's write-behind: an entry extending the one on disk holds the job's
// new rows only, and restores all; what is stored is not written again; jobs of a session
// merge while queued; the queue's bound and a base entry gone drop a job (counted, the session told);
// a block that went bad in the base stays detectable.

#include "check.h"
#include "persist-fixtures.h"
#include "kv/disk-writer.h"

#include <fcntl.h>
#include <sys/stat.h>

static const std::chrono::milliseconds NO_DELAY(0);

static std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// the job of a context's blocks [first_new, n): its rows of those blocks only
static llama_opt_persist_job job_of(const context & c, uint32_t first_new, std::shared_ptr<llama_opt_persist_account> account) {
    llama_opt_persist_job job;
    job.account   = std::move(account);
    job.tokens    = c.tokens;
    job.chain     = c.chain;
    job.first_new = first_new;
    job.rows.assign(c.rows.begin() + (long) first_new * B * 32, c.rows.end());
    return job;
}

static std::vector<uint8_t> restore(const llama_opt_persist_store & store, const context & c, uint32_t & got,
                                    llama_opt_persist_miss & miss) {
    std::string why;
    const auto m = store.find(layout(), c.chain, c.tokens.data(), c.chain.size());
    std::vector<uint8_t> rows(c.rows.size());
    got = m.n_blocks ? store.load(m.entry, 0, m.n_blocks, rows.data(), why, miss) : 0;
    rows.resize((size_t) got * B * 32);
    return rows;
}

static void test_an_extension_holds_the_new_blocks_only() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    const context prompt = make(3, 1);
    const context longer = make(7, 2, 3, &prompt);
    const context longest = make(8, 3, 7, &longer);
    CHECK(writer.submit(job_of(prompt, 0, account)) && writer.flush(10));
    CHECK(writer.submit(job_of(longer, 3, account)) && writer.flush(10));  // 4 blocks of rows: the first 3 stay where they are
    CHECK(writer.submit(job_of(longest, 7, account)) && writer.flush(10));
    const auto entries = store.list();
    CHECK(entries.size() == 3);  // the parents are kept
    uint64_t sizes = 0;
    for (const auto & e : entries) {
        sizes += e.file_size;
        CHECK(e.base_blocks == (e.chain.size() == 3 ? 0u : e.chain.size() == 7 ? 3u : 7u));
        CHECK(e.file_size == llama_opt_persist_file_size(layout(), e.chain.size(), e.base_blocks));
        CHECK(store.verify(e.path).empty());
    }
    CHECK(writer.counts().saves == 3 && writer.counts().errors == 0 && writer.counts().bytes_written == sizes);
    CHECK(sizes == llama_opt_persist_file_size(layout(), 3) + llama_opt_persist_file_size(layout(), 7, 3) +
                   llama_opt_persist_file_size(layout(), 8, 7));
    uint32_t got;
    llama_opt_persist_miss miss;
    CHECK(restore(store, longest, got, miss) == longest.rows && got == 8 && miss == llama_opt_persist_miss::none);
    std::string why;
    // a whole save of it replaces the extension (the same name); the entries it extended, extended by
    // none now, are subsumed
    CHECK(store.save(layout(), longest.tokens, longest.chain, longest.rows.data(), why) && store.list().size() == 1);
    CHECK(store.list()[0].base_blocks == 0 && restore(store, longest, got, miss) == longest.rows && got == 8);
}

// the 3 entries of a context grown in 3 turns (3, 5 and 6 blocks), the last two extensions
static context grow(llama_opt_persist_write_behind & writer) {
    auto account = std::make_shared<llama_opt_persist_account>();
    const context turn1 = make(3, 1), turn2 = make(5, 2, 3, &turn1), turn3 = make(6, 3, 5, &turn2);
    CHECK(writer.submit(job_of(turn1, 0, account)) && writer.flush(10));
    CHECK(writer.submit(job_of(turn2, 3, account)) && writer.flush(10));
    CHECK(writer.submit(job_of(turn3, 5, account)) && writer.flush(10));
    return turn3;
}

static std::string entry_of(const llama_opt_persist_store & store, size_t n_blocks) {
    for (const auto & e : store.list()) {
        if (e.chain.size() == n_blocks) {
            return e.path;
        }
    }
    return "";
}

static void test_a_missing_parent_is_a_miss_for_its_blocks_and_cleanup_removes_the_orphans() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    const context c = grow(writer);
    CHECK(store.remove(entry_of(store, 5)));  // the middle one
    uint32_t got;
    llama_opt_persist_miss miss;
    llama_opt_persist_entry orphan;
    CHECK(llama_opt_persist_read_header(entry_of(store, 6), orphan, nullptr));
    std::vector<uint8_t> rows(6 * B * 32);
    std::string why;
    CHECK(store.load(orphan, 0, 6, rows.data(), why, miss) == 0 && miss == llama_opt_persist_miss::not_stored);
    rows = restore(store, c, got, miss);  // a lookup passes over it: the first entry's 3 blocks
    CHECK(got == 3 && miss == llama_opt_persist_miss::none && std::equal(rows.begin(), rows.end(), c.rows.begin()));
    CHECK(store.verify(entry_of(store, 6)).find("parent entry (blocks 0-4) is missing") != std::string::npos);
    CHECK(store.verify(entry_of(store, 3)).empty());
    CHECK(store.cleanup(0, 0) == 1 && store.list().size() == 1 && entry_of(store, 6).empty());
}

static void test_a_bad_block_of_a_parent_stops_a_restore_before_it() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    const context c = grow(writer);
    llama_opt_persist_entry parent;
    CHECK(llama_opt_persist_read_header(entry_of(store, 5), parent, nullptr));
    flip_byte(parent.path, (long) (parent.data_offset + B * 32 + 3));  // in block 4 (its own second)
    CHECK(store.verify(parent.path) == "checksum mismatch in block 4");
    CHECK(store.verify(entry_of(store, 6)).empty());  // its own blocks are sound
    uint32_t got;
    llama_opt_persist_miss miss;
    const std::vector<uint8_t> rows = restore(store, c, got, miss);
    CHECK(got == 4 && miss == llama_opt_persist_miss::corrupt && std::equal(rows.begin(), rows.end(), c.rows.begin()));
    CHECK(entry_of(store, 5).empty());  // removed; its child, an orphan now, with the next cleanup
    CHECK(store.cleanup(0, 0) == 1 && store.list().size() == 1);
}

static void test_the_size_budget_never_leaves_an_extension_without_its_parent() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    grow(writer);
    const context other = make(2, 9);
    std::string why;
    struct timespec old_times[2] = { { 1000, 0 }, { 1000, 0 } };
    CHECK(utimensat(AT_FDCWD, entry_of(store, 3).c_str(), old_times, 0) == 0);  // the root, least recently used
    CHECK(store.save(layout(), other.tokens, other.chain, other.rows.data(), why));
    const uint64_t other_size = llama_opt_persist_file_size(layout(), 2);
    CHECK(store.cleanup(0, other_size + 1) == 3);  // the root goes, and its descendants with it
    CHECK(store.list().size() == 1 && entry_of(store, 2) != "");
    // nor are the parents of the entry a save keeps (its own), least recently used as they may be
    llama_opt_persist_store fresh(fresh_dir("kv"));
    llama_opt_persist_write_behind fresh_writer(fresh, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    CHECK(fresh.save(layout(), other.tokens, other.chain, other.rows.data(), why));
    const context again = grow(fresh_writer);
    CHECK(utimensat(AT_FDCWD, entry_of(fresh, 3).c_str(), old_times, 0) == 0);
    uint64_t total = 0;
    for (const auto & e : fresh.list()) {
        total += e.file_size;
    }
    CHECK(fresh.cleanup(0, total - 1, entry_of(fresh, 6)) == 1 && entry_of(fresh, 2).empty() && fresh.list().size() == 3);
    uint32_t got;
    llama_opt_persist_miss miss;
    CHECK(restore(fresh, again, got, miss) == again.rows && got == 6);
}

static void test_what_is_stored_is_not_written_again() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    const context c = make(4, 1);
    const context prefix = make(2, 1);  // the same first blocks
    CHECK(writer.submit(job_of(c, 0, account)) && writer.flush(10));
    const std::string path = store.list()[0].path;
    struct timespec old_times[2] = { { 1000, 0 }, { 1000, 0 } };
    CHECK(utimensat(AT_FDCWD, path.c_str(), old_times, 0) == 0);
    CHECK(writer.submit(job_of(prefix, 0, account)) && writer.flush(10));
    CHECK(writer.counts().saves == 1 && store.list().size() == 1);
    CHECK(store.list()[0].mtime > 1000);  // marked used instead
}

static void test_queued_jobs_of_a_session_merge() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto a = std::make_shared<llama_opt_persist_account>(), b = std::make_shared<llama_opt_persist_account>();
    const context turn1 = make(2, 1), turn2 = make(5, 1, 2, &turn1), turn3 = make(6, 1, 5, &turn2);
    const context other = make(3, 9);
    writer.hold(true);
    CHECK(writer.submit(job_of(turn1, 0, a)));
    CHECK(writer.submit(job_of(other, 0, b)));
    CHECK(writer.submit(job_of(turn2, 2, a)));  // merges into turn1's job, although b's is queued after it
    CHECK(writer.submit(job_of(turn3, 5, a)));
    CHECK(!writer.flush(0.05));
    writer.hold(false);
    CHECK(writer.flush(10));
    CHECK(writer.counts().writes_queued == 4 && writer.counts().writes_coalesced == 2 && a->counts.writes_coalesced == 2);
    CHECK(writer.counts().saves == 2 && a->counts.saves == 1 && b->counts.saves == 1);
    std::string why;
    llama_opt_persist_miss miss;
    const auto m = store.find(layout(), turn3.chain, turn3.tokens.data(), 6);
    std::vector<uint8_t> rows(6 * B * 32);
    CHECK(m.n_blocks == 6 && store.load(m.entry, 0, 6, rows.data(), why, miss) == 6 && rows == turn3.rows);
}

static void test_the_pieces_of_a_prompt_merge_within_the_delay() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, std::chrono::seconds(30), nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    const context piece1 = make(2, 1), piece2 = make(4, 1, 2, &piece1);
    CHECK(writer.submit(job_of(piece1, 0, account)));
    CHECK(writer.submit(job_of(piece2, 2, account)));
    usleep(100 * 1000);
    CHECK(store.list().empty() && writer.counts().saves == 0);  // waiting for a next piece
    CHECK(writer.flush(10) && writer.counts().saves == 1 && writer.counts().writes_coalesced == 1);  // flush: no wait
    CHECK(store.list().size() == 1 && store.list()[0].n_tokens == 4 * B);
}

static void test_a_lookup_waits_only_for_jobs_holding_more_of_its_prompt() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, std::chrono::seconds(30), nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    const context prompt = make(4, 1), other = make(4, 2);
    CHECK(writer.submit(job_of(prompt, 0, account)) && writer.submit(job_of(other, 0, account)));
    CHECK(writer.flush_holding(prompt.chain, 4, 10));  // nothing more of it queued: no wait
    CHECK(store.list().empty());
    CHECK(writer.flush_holding(make(6, 1, 4, &prompt).chain, 2, 10));  // a longer prompt sharing its 4 blocks
    const auto entries = store.list();
    CHECK(entries.size() == 1 && entries[0].n_tokens == 4 * B);  // that job only (the other's still waits)
}

static void test_over_the_bound_a_job_is_dropped_and_the_session_told() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c1 = make(4, 1), c2 = make(4, 2);
    const llama_opt_persist_job probe = job_of(c1, 0, nullptr);
    llama_opt_persist_write_behind writer(store, layout(), probe.bytes() + 10, 0, NO_DELAY, nullptr);
    auto a = std::make_shared<llama_opt_persist_account>(), b = std::make_shared<llama_opt_persist_account>();
    writer.hold(true);
    CHECK(writer.submit(job_of(c1, 0, a)));
    CHECK(!writer.submit(job_of(c2, 0, b)));  // never waits: dropped
    CHECK(writer.counts().writes_dropped == 1 && b->counts.writes_dropped == 1 && b->lost && b->blocks_on_disk == 0);
    writer.hold(false);
    CHECK(writer.flush(10) && writer.counts().saves == 1 && !a->lost);
    CHECK(writer.submit(job_of(c2, 0, b)) && writer.flush(10) && writer.counts().saves == 2);  // room again
}

// writes a 3-block prompt through `writer`; returns a 5-block context extending it
static context write_prompt(llama_opt_persist_write_behind & writer, const std::shared_ptr<llama_opt_persist_account> & account) {
    const context prompt = make(3, 1);
    CHECK(writer.submit(job_of(prompt, 0, account)) && writer.flush(10));
    return make(5, 1, 3, &prompt);
}

static void test_a_job_whose_base_is_gone_is_dropped() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    const context longer = write_prompt(writer, account);
    CHECK(store.remove(store.list()[0].path));  // cleaned up by another process, say
    CHECK(writer.submit(job_of(longer, 3, account)) && writer.flush(10));
    CHECK(store.list().empty() && writer.counts().writes_dropped == 1 && writer.counts().errors == 0);
    CHECK(account->lost && account->blocks_on_disk == 0);
}

static void test_a_failed_write_is_counted_and_warned_once() {
    llama_opt_persist_store store(fresh_dir("kv"));
    int warnings = 0;
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, [&](const std::string &) { ++warnings; });
    auto account = std::make_shared<llama_opt_persist_account>();
    store.fail_after_bytes(200);
    CHECK(writer.submit(job_of(make(2, 1), 0, account)) && writer.submit(job_of(make(2, 2), 0, account)) && writer.flush(10));
    CHECK(writer.counts().errors == 2 && account->counts.errors == 2 && warnings == 1 && account->lost);
    CHECK(store.list().empty() && store.cleanup(0, 0) == 0);  // no temporary file left
    store.fail_after_bytes(0);
    CHECK(writer.submit(job_of(make(2, 3), 0, account)) && writer.flush(10) && writer.counts().saves == 1);
}

static void test_a_cancelled_sessions_jobs_are_not_written() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto a = std::make_shared<llama_opt_persist_account>(), b = std::make_shared<llama_opt_persist_account>();
    writer.hold(true);
    CHECK(writer.submit(job_of(make(2, 1), 0, a)) && writer.submit(job_of(make(2, 2), 0, b)));
    writer.cancel(a.get());
    writer.hold(false);
    CHECK(writer.flush(10) && a->counts.writes_dropped == 1 && a->counts.saves == 0 && b->counts.saves == 1);
    CHECK(store.list().size() == 1);
}

static void test_stop_drops_what_is_queued() {
    llama_opt_persist_store store(fresh_dir("kv"));
    llama_opt_persist_write_behind writer(store, layout(), 1 << 20, 0, NO_DELAY, nullptr);
    auto account = std::make_shared<llama_opt_persist_account>();
    writer.hold(true);
    CHECK(writer.submit(job_of(make(2, 1), 0, account)));
    writer.stop();
    CHECK(writer.counts().writes_dropped == 1 && store.list().empty() && writer.flush(0));
    CHECK(!writer.submit(job_of(make(2, 2), 0, account)));
}

int main() {
    test_an_extension_holds_the_new_blocks_only();
    test_a_missing_parent_is_a_miss_for_its_blocks_and_cleanup_removes_the_orphans();
    test_a_bad_block_of_a_parent_stops_a_restore_before_it();
    test_the_size_budget_never_leaves_an_extension_without_its_parent();
    test_what_is_stored_is_not_written_again();
    test_queued_jobs_of_a_session_merge();
    test_the_pieces_of_a_prompt_merge_within_the_delay();
    test_a_lookup_waits_only_for_jobs_holding_more_of_its_prompt();
    test_over_the_bound_a_job_is_dropped_and_the_session_told();
    test_a_job_whose_base_is_gone_is_dropped();
    test_a_failed_write_is_counted_and_warned_once();
    test_a_cancelled_sessions_jobs_are_not_written();
    test_stop_drops_what_is_queued();
    remove_made_dirs();
    return check_result("test-opt-kv-write-behind");
}
