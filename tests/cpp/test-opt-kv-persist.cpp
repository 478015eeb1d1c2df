// kv-cache-persist store: round trip of any block-aligned prefix, layout mismatches as misses,
// corruption found by checksums (and the entry removed), atomic saves, subsumed entries,
// cleanup by age and size.

#include "check.h"
#include "persist-fixtures.h"
#include "kv/block-hash.h"
#include "kv/disk-dir.h"
#include "kv/disk-store.h"
#include "base/checksum.h"
#include "kv/file-hash.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_round_trip_of_any_prefix() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c = make(5, 1);
    std::string why;
    llama_opt_persist_miss miss;
    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    // a prompt sharing the first 3 blocks
    const context p = make(6, 2, 3, &c);
    auto m = store.find(layout(), p.chain, p.tokens.data(), 6);
    CHECK(m.n_blocks == 3 && m.miss == llama_opt_persist_miss::none);
    std::vector<uint8_t> rows(3 * B * 32);
    CHECK(store.load(m.entry, 1, 3, rows.data(), why, miss) == 2);  // blocks 1 and 2
    CHECK(std::equal(rows.begin(), rows.begin() + 2 * B * 32, c.rows.begin() + B * 32));
    CHECK(store.find(layout(), c.chain, c.tokens.data(), 2).n_blocks == 2);  // capped
    const context other = make(3, 9);
    CHECK(store.find(layout(), other.chain, other.tokens.data(), 3).miss == llama_opt_persist_miss::not_stored);
}

static void test_another_model_is_a_miss() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c = make(2, 1);
    std::string why;
    CHECK(store.save(layout(7), c.tokens, c.chain, c.rows.data(), why));
    auto m = store.find(layout(8), c.chain, c.tokens.data(), 2);
    CHECK(m.n_blocks == 0 && m.miss == llama_opt_persist_miss::incompatible);
    llama_opt_persist_layout wider = layout();
    wider.bytes_per_token = 64;
    CHECK(store.find(wider, c.chain, c.tokens.data(), 2).miss == llama_opt_persist_miss::incompatible);
}

static void test_corruption_is_found_and_removed() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c = make(3, 1);
    std::string why;
    llama_opt_persist_miss miss;
    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    auto m = store.find(layout(), c.chain, c.tokens.data(), 3);
    CHECK(m.n_blocks == 3 && store.verify(m.entry.path).empty());
    flip_byte(m.entry.path, (long) (m.entry.data_offset + 2 * B * 32 + 5));  // in block 2
    CHECK(store.verify(m.entry.path).find("block 2") != std::string::npos);
    std::vector<uint8_t> rows(3 * B * 32);
    CHECK(store.load(m.entry, 0, 3, rows.data(), why, miss) == 2);
    CHECK(why.find("checksum") != std::string::npos && miss == llama_opt_persist_miss::corrupt);
    CHECK(access(m.entry.path.c_str(), F_OK) != 0);  // removed

    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    m = store.find(layout(), c.chain, c.tokens.data(), 3);
    flip_byte(m.entry.path, 20);  // in the header
    CHECK(store.find(layout(), c.chain, c.tokens.data(), 3).n_blocks == 0);
    CHECK(store.list().size() == 1 && !store.list()[0].problem.empty());
    CHECK(store.cleanup(0, 0) == 1 && store.list().empty());

    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    m = store.find(layout(), c.chain, c.tokens.data(), 3);
    CHECK(truncate(m.entry.path.c_str(), (off_t) (m.entry.file_size - 10)) == 0);
    CHECK(store.find(layout(), c.chain, c.tokens.data(), 3).n_blocks == 0);
    CHECK(store.list()[0].problem.find("truncated") == 0);

    std::ofstream(store.dir() + "/foreign.llkv") << "not ours";
    std::ofstream(store.dir() + "/notes.txt") << "not ours either";
    CHECK(store.cleanup(0, 0) == 2);  // the truncated entry and the foreign .llkv file
    CHECK(access((store.dir() + "/notes.txt").c_str(), F_OK) == 0);  // other files are left alone
}

static void test_a_failed_save_leaves_nothing() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c = make(4, 1);
    std::string why;
    store.fail_after_bytes(300);
    CHECK(!store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    CHECK(why.find("No space") != std::string::npos);
    store.fail_after_bytes(0);
    CHECK(store.list().empty());
    CHECK(store.cleanup(0, 0) == 0);  // no temporary file left either

    llama_opt_persist_store nowhere("/dev/null/kv");
    CHECK(!nowhere.save(layout(), c.tokens, c.chain, c.rows.data(), why) && !why.empty());
    CHECK(nowhere.find(layout(), c.chain, c.tokens.data(), 4).n_blocks == 0);
}

static void test_longer_context_subsumes_its_prefixes() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context short_ = make(2, 1);
    const context long_  = make(4, 2, 2, &short_);
    const context other  = make(3, 3);
    std::string why;
    CHECK(store.save(layout(), short_.tokens, short_.chain, short_.rows.data(), why));
    CHECK(store.save(layout(), other.tokens, other.chain, other.rows.data(), why));
    CHECK(store.save(layout(), long_.tokens, long_.chain, long_.rows.data(), why));
    CHECK(store.list().size() == 2);
    CHECK(store.find(layout(), short_.chain, short_.tokens.data(), 2).n_blocks == 2);
}

static void test_cleanup_by_size_removes_least_recently_used() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context a = make(2, 1), b = make(2, 2), c = make(2, 3);
    std::string why;
    llama_opt_persist_miss miss;
    for (const context * x : { &a, &b, &c }) {
        CHECK(store.save(layout(), x->tokens, x->chain, x->rows.data(), why));
    }
    auto entries = store.list();
    CHECK(entries.size() == 3);
    // a is the oldest by mtime, then b; loading a makes it the most recent
    for (size_t i = 0; i < entries.size(); ++i) {
        const std::string stamp = "touch -d '" + std::to_string(10 - (int) i) + " minutes ago' " + entries[i].path;
        CHECK(system(stamp.c_str()) == 0);
    }
    auto m = store.find(layout(), a.chain, a.tokens.data(), 2);
    std::vector<uint8_t> rows(2 * B * 32);
    CHECK(store.load(m.entry, 0, 2, rows.data(), why, miss) == 2);
    const uint64_t one = store.list()[0].file_size;
    CHECK(store.cleanup(0, 2 * one) == 1);
    CHECK(store.find(layout(), a.chain, a.tokens.data(), 2).n_blocks == 2);
    CHECK(store.cleanup(3600, 0) == 0);   // nothing older than an hour
    CHECK(store.cleanup(60, 0) == 1);     // the other one is 9-10 minutes old
}

static struct stat stat_of(const std::string & file) {
    struct stat st {};
    CHECK(stat(file.c_str(), &st) == 0);
    return st;
}

// the hash of the file at `file` as a model loaded now would have it
static uint64_t hash_of(const std::string & file, const std::string & dir) {
    return llama_opt_file_hash(file, dir, stat_of(file));
}

static bool throws_changed(const std::string & file, const std::string & dir, const struct stat & loaded) {
    try {
        llama_opt_file_hash(file, dir, loaded);
    } catch (const std::runtime_error & e) {
        return std::string(e.what()).find("no longer the file the model was loaded from") != std::string::npos;
    }
    return false;
}

static void test_file_hash_is_remembered_per_file_version() {
    const std::string dir  = fresh_dir("kv");
    const std::string file = dir + ".model";
    std::ofstream(file) << "weights v1";
    const uint64_t h1 = hash_of(file, dir);
    CHECK(h1 == llama_opt_checksum("weights v1", 10, 0));
    // just written: not remembered (it could be written again without its times changing)
    CHECK(!std::ifstream(dir + "/file-hashes").good());
    usleep(150000);  // older than the timestamps' granularity (100 ms where they have nanoseconds)
    CHECK(hash_of(file, dir) == h1);
    std::ifstream memo(dir + "/file-hashes");
    std::string line;
    CHECK(std::getline(memo, line) && line.find(file) != std::string::npos);
    CHECK(hash_of(file, dir) == h1);  // from the memo
    std::ofstream(file) << "weights v2";          // a new version: size or mtime differ
    CHECK(system(("touch -d '1 minute ago' " + file).c_str()) == 0);
    CHECK(hash_of(file, dir) == llama_opt_checksum("weights v2", 10, 0));
    bool thrown = false;
    try {
        llama_opt_file_hash(dir + "/missing", dir, stat_of(file));
    } catch (const std::runtime_error &) {
        thrown = true;
    }
    CHECK(thrown);
}

static void test_the_budget_keeps_the_entry_just_saved() {
    llama_opt_persist_store store(fresh_dir("kv"));
    std::string why;
    const context a = make(2, 1), b = make(2, 2), c = make(2, 3);
    CHECK(store.save(layout(), a.tokens, a.chain, a.rows.data(), why));
    const uint64_t one = store.list()[0].file_size;
    CHECK(store.save(layout(), b.tokens, b.chain, b.rows.data(), why, 2 * one));
    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why, 2 * one));  // in the same second, likely
    CHECK(store.list().size() == 2);
    CHECK(store.find(layout(), c.chain, c.tokens.data(), 2).n_blocks == 2);  // the newest stays
    CHECK(store.find(layout(), a.chain, a.tokens.data(), 2).n_blocks == 0);  // the oldest went
    const context big = make(64, 4);  // rows of 64 blocks: more than two small entries
    CHECK(!store.save(layout(), big.tokens, big.chain, big.rows.data(), why, 2 * one));
    CHECK(why.find("larger than the size budget") != std::string::npos);
    CHECK(store.list().size() == 2);
}

static void test_a_file_changed_since_the_model_loaded_is_not_hashed() {
    const std::string dir  = fresh_dir("kv");
    const std::string file = dir + ".model";
    std::ofstream(file) << "weights v1";
    const struct stat loaded = stat_of(file);
    CHECK(llama_opt_file_hash(file, dir, loaded) == llama_opt_checksum("weights v1", 10, 0));
    const std::string update = dir + ".update";
    std::ofstream(update) << "weights v2";
    CHECK(rename(update.c_str(), file.c_str()) == 0);  // replaced, as a download or an update would
    CHECK(throws_changed(file, dir, loaded));
    const struct stat replaced = stat_of(file);
    usleep(20000);
    std::ofstream(file) << "weights v3";  // written in place: the same inode
    CHECK(throws_changed(file, dir, replaced));
    CHECK(hash_of(file, dir) == llama_opt_checksum("weights v3", 10, 0));
}

static void test_a_file_rewritten_with_its_mtime_restored_is_hashed_again() {
    const std::string dir  = fresh_dir("kv");
    const std::string file = dir + ".model";
    std::ofstream(file) << "weights v1";
    struct stat before;
    stat(file.c_str(), &before);
    CHECK(hash_of(file, dir) == llama_opt_checksum("weights v1", 10, 0));
    usleep(20000);
    std::ofstream(file) << "weights v2";  // same size, same inode
    const struct timespec times[2] = { before.st_atim, before.st_mtim };
    CHECK(utimensat(AT_FDCWD, file.c_str(), times, 0) == 0);  // as cp -p or rsync -t would
    CHECK(hash_of(file, dir) == llama_opt_checksum("weights v2", 10, 0));
}

static void test_permissions_and_links() {  // issue 20
    const std::string dir = fresh_dir("kv");
    llama_opt_persist_store store(dir);
    const context c = make(3, 1);
    std::string why;
    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    struct stat st;
    CHECK(stat(dir.c_str(), &st) == 0 && (st.st_mode & 0777) == 0700);
    const auto entries = store.list();
    CHECK(entries.size() == 1 && stat(entries[0].path.c_str(), &st) == 0 && (st.st_mode & 0777) == 0600);
    chmod(dir.c_str(), 0775);
    CHECK(!llama_opt_persist_check_dir(dir, why) && why.find("chmod 700 " + dir) != std::string::npos);
    CHECK(!store.save(layout(), c.tokens, c.chain, c.rows.data(), why));  // refused before writing
    const auto refused = store.find(layout(), c.chain, c.tokens.data(), 3);  // and not read
    CHECK(refused.n_blocks == 0 && refused.miss == llama_opt_persist_miss::unsafe_dir);
    chmod(dir.c_str(), 0755);
    CHECK(llama_opt_persist_check_dir(dir, why) && stat(dir.c_str(), &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(!llama_opt_persist_check_dir(entries[0].path, why) && why.find("not a directory") != std::string::npos);
    const std::string target = dir + "/../outside.llkv";
    { std::ofstream(target) << "x"; }
    const std::string link = dir + "/zz.llkv";
    CHECK(symlink(target.c_str(), link.c_str()) == 0);
    bool seen = false;
    for (const auto & e : store.list()) {
        seen = seen || (e.path == link && e.problem == "a symbolic link (not followed)");
    }
    CHECK(seen);
    CHECK(store.cleanup(0, 0) == 1);
    CHECK(access(link.c_str(), F_OK) != 0 && access(target.c_str(), F_OK) == 0 && store.list().size() == 1);
}

// A header whose sizes agree with each other and whose 64-bit arithmetic wraps around to the real
// file size (found by fuzz-persist): inconsistent, read no further, no table allocated for its
// 2^31 tokens.
static void test_sizes_that_wrap_around_are_inconsistent() {
    llama_opt_persist_store store(fresh_dir("kv"));
    const context c = make(2, 1);
    std::string why;
    CHECK(store.save(layout(), c.tokens, c.chain, c.rows.data(), why));
    const std::string path = store.list().at(0).path;
    struct stat st;
    CHECK(stat(path.c_str(), &st) == 0);
    const uint64_t n_tokens = 0x7fffffff;  // odd: invertible mod 2^64
    const uint64_t chain_offset = 128 + 4 * n_tokens, sums_offset = chain_offset + 8 * n_tokens;
    const uint64_t data_offset = (sums_offset + 8 * n_tokens + 4095) / 4096 * 4096;
    uint64_t inverse = n_tokens;
    for (int i = 0; i < 6; ++i) {
        inverse *= 2 - n_tokens * inverse;
    }
    const uint64_t bytes_per_token = ((uint64_t) st.st_size - data_offset) * inverse;  // n_tokens * it wraps
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    auto put = [&](long offset, uint64_t v, size_t n) { f.seekp(offset); f.write((const char *) &v, (std::streamsize) n); };
    put(40, n_tokens, 4);
    put(44, 1, 4);  // block size
    put(72, bytes_per_token, 8);
    put(88, chain_offset, 8);
    put(96, sums_offset, 8);
    put(104, data_offset, 8);
    put(112, (uint64_t) st.st_size, 8);
    f.close();
    CHECK(data_offset + n_tokens * bytes_per_token == (uint64_t) st.st_size);  // what a wrapping check would accept
    const auto entries = store.list();
    CHECK(entries.size() == 1 && entries[0].problem == "inconsistent header");
    CHECK(store.find(layout(), c.chain, c.tokens.data(), 2).n_blocks == 0);
}

int main() {
    test_sizes_that_wrap_around_are_inconsistent();
    test_permissions_and_links();
    test_the_budget_keeps_the_entry_just_saved();
    test_a_file_rewritten_with_its_mtime_restored_is_hashed_again();
    test_a_file_changed_since_the_model_loaded_is_not_hashed();
    test_file_hash_is_remembered_per_file_version();
    test_round_trip_of_any_prefix();
    test_another_model_is_a_miss();
    test_corruption_is_found_and_removed();
    test_a_failed_save_leaves_nothing();
    test_longer_context_subsumes_its_prefixes();
    test_cleanup_by_size_removes_least_recently_used();
    remove_made_dirs();
    return check_result("test-opt-kv-persist");
}
