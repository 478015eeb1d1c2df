#include "kv/disk-store.h"

#include "kv/disk-dir.h"
#include "kv/disk-io.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static constexpr char    TMP_PREFIX[] = ".tmp-";
static constexpr int64_t TMP_STALE_S  = 3600;

static bool starts_with(const std::string & s, const char * prefix) {
    return s.compare(0, strlen(prefix), prefix) == 0;
}

static std::vector<std::string> dir_files(const std::string & dir) {
    std::vector<std::string> names;
    if (DIR * d = opendir(dir.c_str())) {
        while (const dirent * e = readdir(d)) {
            names.emplace_back(e->d_name);
        }
        closedir(d);
    }
    std::sort(names.begin(), names.end());
    return names;
}

// copy_file_range (Linux): the kernel copies, without the bytes passing through us (a clone on
// file systems that share extents); elsewhere ENOSYS, and the caller reads and writes.
static ssize_t kernel_copy(int src_fd, uint64_t src_offset, int dst_fd, uint64_t dst_offset, size_t n) {
#if defined(__linux__)
    loff_t from = (loff_t) src_offset, to = (loff_t) dst_offset;
    return copy_file_range(src_fd, &from, dst_fd, &to, n, 0);
#else
    (void) src_fd, (void) src_offset, (void) dst_fd, (void) dst_offset, (void) n;
    errno = ENOSYS;
    return -1;
#endif
}

llama_opt_persist_store::llama_opt_persist_store(std::string dir) : dir_(std::move(dir)) {}

std::vector<std::string> llama_opt_persist_store::entry_names() const {
    std::vector<std::string> names;
    for (std::string & name : dir_files(dir_)) {
        if (llama_opt_persist_has_entry_suffix(name) && !starts_with(name, TMP_PREFIX)) {
            names.push_back(std::move(name));
        }
    }
    return names;
}

llama_opt_persist_store::match llama_opt_persist_store::find(const llama_opt_persist_layout & layout,
                                                             const std::vector<uint64_t> & chain,
                                                             const llama_token * tokens, size_t max_blocks) const {
    match best;
    std::string why;
    if (!llama_opt_persist_check_dir(dir_, why)) {  // checked when the context was made: it may have changed
        best.miss = llama_opt_persist_miss::unsafe_dir;
        return best;
    }
    bool  foreign = false;  // these tokens are stored, for another model or build
    for (const std::string & name : entry_names()) {
        llama_opt_persist_entry  e;
        std::vector<llama_token> stored;
        if (!llama_opt_persist_read_header(dir_ + "/" + name, e, &stored)) {
            continue;  // cleanup() removes broken entries; a lookup only skips them
        }
        size_t k = 0;
        const size_t limit = std::min({ max_blocks, e.chain.size(), chain.size() });
        while (k < limit && e.chain[k] == chain[k]) {
            ++k;
        }
        const size_t B = e.layout.block_size;
        while (k > 0 && !std::equal(tokens, tokens + k * B, stored.begin())) {
            --k;  // a hash collision: trust only what the tokens confirm
        }
        if (k == 0) {
            continue;
        }
        if (e.layout != layout) {
            foreign = true;
            continue;
        }
        if (k > best.n_blocks) {
            best.entry    = std::move(e);
            best.n_blocks = (uint32_t) k;
        }
    }
    best.miss = best.n_blocks > 0 ? llama_opt_persist_miss::none
              : foreign           ? llama_opt_persist_miss::incompatible
                                  : llama_opt_persist_miss::not_stored;
    return best;
}

uint32_t llama_opt_persist_store::load(const llama_opt_persist_entry & e, uint32_t first, uint32_t last,
                                       uint8_t * dst, std::string & why, llama_opt_persist_miss & miss) const {
    const uint64_t block_bytes = e.layout.block_bytes();
    miss = llama_opt_persist_miss::none;
    llama_opt_fd f{ open(e.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    if (f.fd < 0) {
        why  = llama_opt_errno_text("cannot open " + e.path);
        miss = llama_opt_persist_miss::not_stored;  // another process cleaned it up
        return 0;
    }
    uint32_t k = first;
    for (; k < last && k < e.checksums.size(); ++k) {
        const std::string problem = llama_opt_persist_read_block(f.fd, e, k, dst + (uint64_t) (k - first) * block_bytes);
        if (!problem.empty()) {
            why = problem;
            break;
        }
    }
    if (k < last) {
        miss = llama_opt_persist_miss::corrupt;
        remove(e.path);
    } else {
        futimens(f.fd, nullptr);  // recently used
    }
    return k - first;
}

bool llama_opt_persist_store::save(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                   const std::vector<uint64_t> & chain, const uint8_t * rows, std::string & why,
                                   uint64_t max_bytes) const {
    return save_extending(layout, tokens, chain, nullptr, 0, rows, why, max_bytes);
}

bool llama_opt_persist_store::save_extending(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                             const std::vector<uint64_t> & chain, const llama_opt_persist_entry * base,
                                             uint32_t n_base, const uint8_t * rows, std::string & why,
                                             uint64_t max_bytes) const {
    const uint64_t n_blocks = chain.size();
    if (n_blocks == 0 || tokens.size() != n_blocks * layout.block_size) {
        why = "nothing to store: no complete block";
        return false;
    }
    if (n_base > 0 && (!base || base->layout != layout || base->chain.size() < n_base ||
                       !std::equal(chain.begin(), chain.begin() + n_base, base->chain.begin()))) {
        why = "internal error: the base entry does not hold the context's first blocks";
        return false;
    }
    if (!llama_opt_persist_prepare_dir(dir_, why)) {
        return false;
    }
    const uint64_t file_size = llama_opt_persist_file_size(layout, n_blocks);
    if (max_bytes > 0 && file_size > max_bytes) {
        why = "the entry (" + std::to_string(file_size >> 20) + " MiB) is larger than the size budget (" +
              std::to_string(max_bytes >> 20) + " MiB, persist_max_mb)";
        return false;
    }
    llama_opt_fd base_file{ -1 };
    if (n_base > 0) {
        base_file.fd = open(base->path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (base_file.fd < 0 || fstat(base_file.fd, &st) != 0 || (uint64_t) st.st_size != base->file_size) {
            why = "the entry holding its first blocks is gone: " + base->path;  // removed (or replaced) meanwhile
            return false;
        }
    }
    const std::string name = llama_opt_persist_entry_name(layout, chain.back());
    const std::string path = dir_ + "/" + name;
    const uint64_t    block_bytes = layout.block_bytes();
    const auto        fill = [&](const sink & out) {
        if (n_base == 0) {
            return llama_opt_persist_write_entry(layout, tokens, chain, rows, out.write);
        }
        std::vector<uint64_t> sums(base->checksums.begin(), base->checksums.begin() + n_base);
        const std::vector<uint64_t> more = llama_opt_persist_block_checksums(layout, rows, n_blocks - n_base);
        sums.insert(sums.end(), more.begin(), more.end());
        const uint64_t data = llama_opt_persist_write_meta(layout, tokens, chain, sums, out.write);
        return data > 0 && out.copy(base_file.fd, base->data_offset, n_base * block_bytes, data) &&
               out.write(rows, (n_blocks - n_base) * block_bytes, data + n_base * block_bytes);
    };
    if (!write_atomically(name, fill, why)) {
        return false;
    }
    // entries holding a prefix of this context are subsumed: it restores those prefixes too
    for (const llama_opt_persist_entry & e : list()) {
        if (e.problem.empty() && e.path != path && e.layout == layout && e.chain.size() < chain.size() &&
            std::equal(e.chain.begin(), e.chain.end(), chain.begin())) {
            remove(e.path);
        }
    }
    if (max_bytes > 0) {
        cleanup(0, max_bytes, path);
    }
    return true;
}

bool llama_opt_persist_store::write_atomically(const std::string & name, const std::function<bool(const sink &)> & fill,
                                               std::string & why) const {
    static std::atomic<uint64_t> counter{ 0 };
    const std::string path = dir_ + "/" + name;
    // the pid and a random part: a process killed mid-save leaves its file, and a later one with the
    // same pid (the first process of a restarted container) must not find its name taken
    const std::string tmp  = dir_ + "/" + TMP_PREFIX + name + "." + std::to_string(getpid()) + "." +
                            llama_opt_hex(std::random_device{}() ^ ((uint64_t) std::random_device{}() << 32)) + "." +
                            std::to_string(counter++);

    llama_opt_fd f{ open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600) };
    if (f.fd < 0) {
        why = llama_opt_errno_text("cannot write in " + dir_);
        return false;
    }
    const uint64_t fail_after = fail_after_;
    uint64_t       written    = 0;
    // how much of n bytes may be written now: all, or up to the test hook's full disk (0: ENOSPC)
    const auto allowed = [&](uint64_t n) -> uint64_t {
        if (fail_after && written + n > fail_after) {
            n = fail_after > written ? fail_after - written : 0;
            if (n == 0) {
                errno = ENOSPC;  // the test hook: a full disk
            }
        }
        return n;
    };
    sink out;
    out.write = [&](const void * src, uint64_t n, uint64_t offset) {
        const uint8_t * p = (const uint8_t *) src;
        while (n > 0) {
            const size_t chunk = (size_t) allowed(std::min<uint64_t>(n, 1 << 24));
            if (chunk == 0) {
                return false;
            }
            const ssize_t w = pwrite(f.fd, p, chunk, (off_t) offset);
            if (w < 0 && errno == EINTR) {
                continue;
            }
            if (w <= 0) {
                return false;
            }
            p += w;
            n -= (uint64_t) w;
            offset += (uint64_t) w;
            written += (uint64_t) w;
        }
        return true;
    };
    out.copy = [&](int src_fd, uint64_t src_offset, uint64_t n, uint64_t offset) {
        bool kernel = true;  // copy_file_range; where the kernel or the file system cannot, read and write
        std::vector<uint8_t> buffer;
        while (n > 0) {
            const size_t chunk = (size_t) allowed(std::min<uint64_t>(n, 1 << 24));
            if (chunk == 0) {
                return false;
            }
            if (!kernel) {
                buffer.resize(chunk);
                if (!llama_opt_pread_all(src_fd, buffer.data(), chunk, src_offset) || !out.write(buffer.data(), chunk, offset)) {
                    return false;
                }
                src_offset += chunk;
                offset += chunk;
                n -= chunk;
                continue;
            }
            const ssize_t done = kernel_copy(src_fd, src_offset, f.fd, offset, chunk);
            if (done < 0 && (errno == ENOSYS || errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP)) {
                kernel = false;
                continue;
            }
            if (done < 0 && errno == EINTR) {
                continue;
            }
            if (done <= 0) {
                if (done == 0) {
                    errno = EIO;  // the source ended early
                }
                return false;
            }
            src_offset += (uint64_t) done;
            offset += (uint64_t) done;
            n -= (uint64_t) done;
            written += (uint64_t) done;
        }
        return true;
    };
    const bool ok = fill(out) && fsync(f.fd) == 0;
    if (!ok) {
        why = llama_opt_errno_text("cannot write " + tmp);
        unlink(tmp.c_str());
        return false;
    }
    close(f.fd);
    f.fd = -1;
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        why = llama_opt_errno_text("cannot rename " + tmp);
        unlink(tmp.c_str());
        return false;
    }
    llama_opt_fd d{ open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
    if (d.fd >= 0) {
        fsync(d.fd);  // the rename itself survives a crash
    }
    return true;
}

std::vector<llama_opt_persist_entry> llama_opt_persist_store::list() const {
    std::vector<llama_opt_persist_entry> entries;
    for (const std::string & name : entry_names()) {
        llama_opt_persist_entry e;
        llama_opt_persist_read_header(dir_ + "/" + name, e, nullptr);
        entries.push_back(std::move(e));
    }
    return entries;
}

std::string llama_opt_persist_store::verify(const std::string & path) const {
    llama_opt_persist_entry e;
    if (!llama_opt_persist_read_header(path, e, nullptr)) {
        return e.problem;
    }
    std::vector<uint8_t> block(e.layout.block_bytes());
    llama_opt_fd f{ open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    for (size_t k = 0; k < e.checksums.size(); ++k) {
        const std::string problem = llama_opt_persist_read_block(f.fd, e, k, block.data());
        if (!problem.empty()) {
            return problem;
        }
    }
    return "";
}

size_t llama_opt_persist_store::cleanup(int64_t max_age_s, uint64_t max_bytes, const std::string & keep) const {
    const int64_t now     = (int64_t) time(nullptr);
    size_t        removed = 0;
    for (const std::string & name : dir_files(dir_)) {
        struct stat st;
        const std::string path = dir_ + "/" + name;
        if (starts_with(name, TMP_PREFIX) && lstat(path.c_str(), &st) == 0 && now - (int64_t) st.st_mtime > TMP_STALE_S) {
            removed += unlink(path.c_str()) == 0;  // left by a save that was killed
        }
    }
    std::vector<llama_opt_persist_entry> entries = list();
    std::sort(entries.begin(), entries.end(), [](const auto & a, const auto & b) { return a.mtime_ns < b.mtime_ns; });
    uint64_t total = 0;
    for (const auto & e : entries) {
        total += e.file_size;
    }
    for (const auto & e : entries) {
        const bool broken = !e.problem.empty() && e.problem.rfind("cannot read", 0) != 0 && e.problem != "not a regular file";
        const bool old    = max_age_s > 0 && now - e.mtime > max_age_s;
        const bool over   = max_bytes > 0 && total > max_bytes;
        if ((broken || old || over) && e.path != keep && remove(e.path)) {
            total -= e.file_size;
            ++removed;
        }
    }
    return removed;
}

bool llama_opt_persist_store::remove(const std::string & path) const {
    return unlink(path.c_str()) == 0;
}

void llama_opt_persist_store::touch(const std::string & path) const {
    utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // gone meanwhile: nothing to keep
}
