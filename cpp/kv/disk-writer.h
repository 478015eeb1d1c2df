#pragma once

// kv/disk-writer: the disk tier's write-behind (docs/persist-format.md). When a session's prompt
// (or, once computed again on the canonical schedule, its answer) adds complete blocks, the
// scheduler thread copies only the new blocks' rows out of the KV cache and queues a job; a
// background thread writes the entry: an extension of the entry on disk that holds the blocks
// before the new ones (only the new rows are written; docs/persist-format.md), through the
// store's atomic temporary file + fsync + rename. The scheduler thread never writes a file and never
// waits: a job over the queue's bound is dropped and counted. The writer touches only files and
// its own jobs, never llama.cpp or the KV cache, so it needs no lock of the context's.

#include "kv/disk-store.h"
#include "base/stats.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// What the writer did, counted as it goes (any thread reads them; base/counters.def names them).
struct llama_opt_persist_counts {
    std::atomic<uint64_t> writes_queued{ 0 };
    std::atomic<uint64_t> writes_coalesced{ 0 };
    std::atomic<uint64_t> writes_dropped{ 0 };
    std::atomic<uint64_t> saves{ 0 };
    std::atomic<uint64_t> errors{ 0 };
    std::atomic<uint64_t> bytes_written{ 0 };

    void add_to(llama_opt_stats & stats) const;  // adds them to the matching counters
    void reset();
};

// One session's side of the write-behind, shared by the session and its jobs.
struct llama_opt_persist_account {
    llama_opt_persist_counts counts;
    // After a job was dropped or failed (lost): how many blocks of that job's context an entry
    // holds, which the session's next job starts from.
    std::atomic<uint32_t>    blocks_on_disk{ 0 };
    std::atomic<bool>        lost{ false };
    // Its last write failed: the jobs queued behind it, which extend that write, fail with it
    // (counted as errors, not drops: they were lost to the failure, not to the queue).
    std::atomic<bool>        failed{ false };
};

// Blocks of one context to store: the first `first_new` are held by an entry on disk (or will be,
// by a job queued before this one), `rows` holds the rest.
struct llama_opt_persist_job {
    std::shared_ptr<llama_opt_persist_account> account;
    std::vector<llama_token> tokens;  // chain.size() complete blocks
    std::vector<uint64_t>    chain;   // their chained hashes (kv/block-hash, unmasked)
    uint32_t                 first_new = 0;
    std::vector<uint8_t>     rows;    // of blocks [first_new, chain.size()), position-major
    std::chrono::steady_clock::time_point due{};  // written from then on (set when queued)

    uint64_t bytes() const { return rows.size() + tokens.size() * sizeof(llama_token) + chain.size() * 8; }
};

class llama_opt_persist_write_behind {
public:
    // Writes into `store` (which must outlive it) entries of `layout`, keeping the directory within
    // max_store_bytes (0: no limit) as save() does; at most max_queue_bytes of jobs wait. A job is
    // written `delay` after it was queued (or last merged into), so that the next piece of the same
    // prompt merges into it instead of being a second write; flush() does not wait for it. `warn`
    // hears of a failed write (the first of a run of failures, the store's or the session's saves').
    llama_opt_persist_write_behind(const llama_opt_persist_store & store, const llama_opt_persist_layout & layout,
                                   uint64_t max_queue_bytes, uint64_t max_store_bytes, std::chrono::milliseconds delay,
                                   std::function<void(const std::string &)> warn);
    ~llama_opt_persist_write_behind();  // stop()

    llama_opt_persist_write_behind(const llama_opt_persist_write_behind &)             = delete;
    llama_opt_persist_write_behind & operator=(const llama_opt_persist_write_behind &) = delete;

    // Queues a job, never waiting: merged into the same account's last queued job if it extends
    // that one (coalesced: one entry written instead of two); dropped (false, counted, the account
    // told) if the queue would go over its bound or the writer has stopped.
    bool submit(llama_opt_persist_job job);
    // Waits until the jobs queued so far (of `account` only, if not null) are written, up to
    // timeout_s seconds, the delay waived meanwhile; false if some were not by then.
    bool flush(double timeout_s, const llama_opt_persist_account * account = nullptr);
    // flush(), for the jobs holding more than the first n_blocks blocks of `chain`: a lookup of
    // `chain` that finds n_blocks on disk waits for what a queued job would add (an evicted
    // session's prompt asked for again at once).
    bool flush_holding(const std::vector<uint64_t> & chain, size_t n_blocks, double timeout_s);
    // Drops (and counts) the queued jobs of `account` (a session whose KV is not to be trusted);
    // one being written is finished.
    void cancel(const llama_opt_persist_account * account);
    // Finishes the job being written, drops (and counts) the queued ones, ends the thread.
    void stop();

    // Test hook: while held, the writer takes no job (they queue up, to be coalesced or dropped).
    void hold(bool held);

    const llama_opt_persist_counts & counts() const { return counts_; }
    llama_opt_persist_counts &       counts() { return counts_; }

private:
    void run();
    // the first job due (or that a flush waits for), else end(); `wake` says when one will be
    std::deque<llama_opt_persist_job>::iterator next_due(std::chrono::steady_clock::time_point & wake);
    void write(const llama_opt_persist_job & job);
    void drop(const llama_opt_persist_job & job, uint32_t blocks_on_disk);
    void fail(const llama_opt_persist_job & job, uint32_t blocks_on_disk, const std::string & why);
    // waits (the delay waived) until no job `which` picks is queued or being written
    bool wait_written(double timeout_s, const std::function<bool(const llama_opt_persist_job &)> & which);

    const llama_opt_persist_store &          store_;
    const llama_opt_persist_layout           layout_;
    const uint64_t                           max_queue_bytes_;
    const uint64_t                           max_store_bytes_;
    const std::chrono::milliseconds          delay_;
    std::function<void(const std::string &)> warn_;
    llama_opt_persist_counts                 counts_;

    mutable std::mutex                 mutex_;
    std::condition_variable            wake_;  // a job was queued, or stop
    std::condition_variable            done_;  // a job was written (or dropped)
    std::deque<llama_opt_persist_job>  queue_;
    uint64_t                           queued_bytes_ = 0;
    const llama_opt_persist_job *      writing_      = nullptr;  // the job being written (read only, by both threads)
    bool                               busy_         = false;
    bool                               stopping_     = false;
    bool                               held_         = false;
    // what the flush() calls waiting want written: those jobs without delay
    std::vector<const std::function<bool(const llama_opt_persist_job &)> *> urgent_;
    std::thread                        thread_;
};
