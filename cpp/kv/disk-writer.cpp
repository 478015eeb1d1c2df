#include "kv/disk-writer.h"

#include <algorithm>
#include <chrono>

void llama_opt_persist_counts::add_to(llama_opt_stats & stats) const {
    stats.persist_writes_queued    += writes_queued;
    stats.persist_writes_coalesced += writes_coalesced;
    stats.persist_writes_dropped   += writes_dropped;
    stats.persist_saves            += saves;
    stats.persist_errors           += errors;
    stats.persist_bytes_written    += bytes_written;
}

void llama_opt_persist_counts::reset() {
    for (std::atomic<uint64_t> * c : { &writes_queued, &writes_coalesced, &writes_dropped, &saves, &errors, &bytes_written }) {
        *c = 0;
    }
}

// counted for the whole writer and for the job's session
static void count(llama_opt_persist_counts & all, const llama_opt_persist_job & job,
                  std::atomic<uint64_t> llama_opt_persist_counts::* counter, uint64_t n = 1) {
    (all.*counter) += n;
    (job.account->counts.*counter) += n;
}

llama_opt_persist_write_behind::llama_opt_persist_write_behind(const llama_opt_persist_store & store,
                                                               const llama_opt_persist_layout & layout,
                                                               uint64_t max_queue_bytes, uint64_t max_store_bytes,
                                                               std::chrono::milliseconds delay,
                                                               std::function<void(const std::string &)> warn)
    : store_(store), layout_(layout), max_queue_bytes_(max_queue_bytes), max_store_bytes_(max_store_bytes), delay_(delay),
      warn_(std::move(warn)), thread_([this] { run(); }) {}

llama_opt_persist_write_behind::~llama_opt_persist_write_behind() {
    stop();
}

bool llama_opt_persist_write_behind::submit(llama_opt_persist_job job) {
    std::unique_lock<std::mutex> lock(mutex_);
    count(counts_, job, &llama_opt_persist_counts::writes_queued);
    // the account's last queued job, if this one extends it: one entry instead of two
    auto last = std::find_if(queue_.rbegin(), queue_.rend(), [&](const auto & q) { return q.account == job.account; });
    const bool extends = last != queue_.rend() && job.first_new <= last->chain.size() &&
                         last->chain.size() <= job.chain.size() &&
                         std::equal(last->chain.begin(), last->chain.end(), job.chain.begin());
    uint64_t replaced = 0;
    if (extends) {
        if (last->first_new < job.first_new) {  // its rows of the blocks this one's base was to hold
            const uint64_t kept = (uint64_t) (job.first_new - last->first_new) * layout_.block_bytes();
            job.rows.insert(job.rows.begin(), last->rows.begin(), last->rows.begin() + kept);
            job.first_new = last->first_new;
        }
        replaced = last->bytes();
    }
    if (stopping_ || queued_bytes_ - replaced + job.bytes() > max_queue_bytes_) {
        lock.unlock();
        drop(job, job.first_new);  // (what the session queued before may not be written yet: it starts lower, if at all)
        return false;
    }
    queued_bytes_ += job.bytes() - replaced;
    job.due = std::chrono::steady_clock::now() + delay_;
    if (extends) {
        count(counts_, job, &llama_opt_persist_counts::writes_coalesced);
        *last = std::move(job);
    } else {
        queue_.push_back(std::move(job));
    }
    wake_.notify_one();
    return true;
}

bool llama_opt_persist_write_behind::flush(double timeout_s, const llama_opt_persist_account * account) {
    return wait_written(timeout_s, [&](const llama_opt_persist_job & job) { return !account || job.account.get() == account; });
}

bool llama_opt_persist_write_behind::flush_holding(const std::vector<uint64_t> & chain, size_t n_blocks, double timeout_s) {
    return wait_written(timeout_s, [&](const llama_opt_persist_job & job) {
        return job.chain.size() > n_blocks && chain.size() > n_blocks &&
               std::equal(job.chain.begin(), job.chain.begin() + n_blocks + 1, chain.begin());
    });
}

bool llama_opt_persist_write_behind::wait_written(double timeout_s,
                                                  const std::function<bool(const llama_opt_persist_job &)> & which) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto pending = [&] { return (writing_ && which(*writing_)) || std::any_of(queue_.begin(), queue_.end(), which); };
    urgent_.push_back(&which);
    wake_.notify_all();
    bool written = true;
    if (!(timeout_s < 1e9)) {  // (infinite: no deadline, which would overflow the clock)
        done_.wait(lock, [&] { return !pending(); });
    } else {
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(std::max(0.0, timeout_s)));
        written = done_.wait_until(lock, deadline, [&] { return !pending(); });
    }
    urgent_.erase(std::find(urgent_.begin(), urgent_.end(), &which));
    return written;
}

void llama_opt_persist_write_behind::cancel(const llama_opt_persist_account * account) {
    std::deque<llama_opt_persist_job> cancelled;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (it->account.get() == account) {
                queued_bytes_ -= it->bytes();
                cancelled.push_back(std::move(*it));
                it = queue_.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (const llama_opt_persist_job & job : cancelled) {
        drop(job, 0);
    }
    done_.notify_all();
}

void llama_opt_persist_write_behind::stop() {
    std::deque<llama_opt_persist_job> left;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            return;
        }
        stopping_ = true;
        left.swap(queue_);
        queued_bytes_ = 0;
    }
    wake_.notify_all();
    thread_.join();
    for (const llama_opt_persist_job & job : left) {
        drop(job, 0);
    }
    done_.notify_all();
}

void llama_opt_persist_write_behind::hold(bool held) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        held_ = held;
    }
    wake_.notify_all();
}

std::deque<llama_opt_persist_job>::iterator llama_opt_persist_write_behind::next_due(
    std::chrono::steady_clock::time_point & wake) {
    const auto now = std::chrono::steady_clock::now();
    wake = std::chrono::steady_clock::time_point::max();
    if (held_) {
        return queue_.end();
    }
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {  // (a merged job may be due later than the next)
        const bool urgent = std::any_of(urgent_.begin(), urgent_.end(), [&](const auto * which) { return (*which)(*it); });
        if (urgent || it->due <= now) {
            return it;
        }
        wake = std::min(wake, it->due);
    }
    return queue_.end();
}

void llama_opt_persist_write_behind::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        std::chrono::steady_clock::time_point wake;
        const auto next = next_due(wake);
        if (next == queue_.end()) {
            if (wake == std::chrono::steady_clock::time_point::max()) {
                wake_.wait(lock);
            } else {
                wake_.wait_until(lock, wake);
            }
            continue;
        }
        llama_opt_persist_job job = std::move(*next);
        queue_.erase(next);
        queued_bytes_ -= job.bytes();
        writing_ = &job;
        lock.unlock();
        write(job);
        lock.lock();
        writing_ = nullptr;
        done_.notify_all();
    }
}

void llama_opt_persist_write_behind::drop(const llama_opt_persist_job & job, uint32_t blocks_on_disk) {
    count(counts_, job, &llama_opt_persist_counts::writes_dropped);
    job.account->blocks_on_disk = blocks_on_disk;
    job.account->lost           = true;
}

void llama_opt_persist_write_behind::write(const llama_opt_persist_job & job) {
    const uint32_t n = (uint32_t) job.chain.size();
    const llama_opt_persist_store::match stored = store_.find(layout_, job.chain, job.tokens.data(), n);
    if (stored.n_blocks == n) {
        store_.touch(stored.entry.path);  // stored already (maybe within a longer context): used again
        return;
    }
    if (stored.n_blocks < job.first_new) {  // the entry holding its first blocks is gone or never written
        if (job.account->failed) {
            fail(job, stored.n_blocks, "the write it extends failed");
        } else {
            drop(job, stored.n_blocks);  // (cleaned up)
        }
        return;
    }
    std::string why;
    if (const uint64_t written = store_.save_extending(layout_, job.tokens, job.chain, job.first_new > 0 ? &stored.entry : nullptr,
                                                       job.first_new, job.rows.data(), why, max_store_bytes_)) {
        count(counts_, job, &llama_opt_persist_counts::saves);
        count(counts_, job, &llama_opt_persist_counts::bytes_written, written);
        job.account->failed = false;
        store_.saved();
        return;
    }
    const uint32_t on_disk = store_.find(layout_, job.chain, job.tokens.data(), n).n_blocks;
    if (on_disk < job.first_new) {
        drop(job, on_disk);  // its base went while it was being written
        return;
    }
    fail(job, on_disk, why);
}

void llama_opt_persist_write_behind::fail(const llama_opt_persist_job & job, uint32_t blocks_on_disk, const std::string & why) {
    count(counts_, job, &llama_opt_persist_counts::errors);
    job.account->blocks_on_disk = blocks_on_disk;
    job.account->lost           = true;
    job.account->failed         = true;
    if (store_.first_failure() && warn_) {
        warn_("pyllamaopt: could not save the KV of a session (written behind): " + why + " (writes that fail are counted in "
              "persist_errors, not logged again until one succeeds; requests go on without)");
    }
}
