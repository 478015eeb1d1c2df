#include "kv/disk-store.h"

#include "kv/disk-dir.h"
#include "kv/disk-io.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <map>
#include <set>

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
    std::vector<std::pair<uint32_t, llama_opt_persist_entry>> candidates;  // (blocks of `tokens` held, entry)
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
        candidates.emplace_back((uint32_t) k, std::move(e));
    }
    // the longest that is not an orphan (its parents, read only for the candidates tried, all there)
    std::sort(candidates.begin(), candidates.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    for (auto & [k, e] : candidates) {
        if (e.base_blocks == 0 || lineage(e).back().base_blocks == 0) {
            best.entry    = std::move(e);
            best.n_blocks = k;
            break;
        }
    }
    best.miss = best.n_blocks > 0 ? llama_opt_persist_miss::none
              : foreign           ? llama_opt_persist_miss::incompatible
                                  : llama_opt_persist_miss::not_stored;
    return best;
}

std::vector<llama_opt_persist_entry> llama_opt_persist_store::lineage(const llama_opt_persist_entry & e) const {
    std::vector<llama_opt_persist_entry> line{ e };
    std::vector<llama_token>             child_tokens;
    if (e.base_blocks > 0) {
        llama_opt_persist_entry again;  // (its tokens: a parent's chain must agree token by token)
        if (!llama_opt_persist_read_header(e.path, again, &child_tokens) || again.chain != e.chain) {
            return line;
        }
    }
    while (line.back().base_blocks > 0) {
        const llama_opt_persist_entry & child = line.back();
        const uint32_t base = child.base_blocks;
        llama_opt_persist_entry  parent;
        std::vector<llama_token> tokens;
        const bool agrees = llama_opt_persist_read_header(dir_ + "/" + llama_opt_persist_entry_name(child.layout, child.chain[base - 1]),
                                                          parent, &tokens) &&
                            parent.layout == child.layout && parent.chain.size() == base &&
                            std::equal(parent.chain.begin(), parent.chain.end(), child.chain.begin()) &&
                            std::equal(tokens.begin(), tokens.end(), child_tokens.begin());
        if (!agrees) {
            break;  // gone, replaced or another context's: its blocks are not stored
        }
        line.push_back(std::move(parent));
    }
    return line;
}

uint32_t llama_opt_persist_store::load(const llama_opt_persist_entry & e, uint32_t first, uint32_t last,
                                       uint8_t * dst, std::string & why, llama_opt_persist_miss & miss) const {
    const uint64_t block_bytes = e.layout.block_bytes();
    miss = llama_opt_persist_miss::none;
    const std::vector<llama_opt_persist_entry> line = lineage(e);  // each holds blocks [base_blocks, its parent's n)
    std::vector<llama_opt_fd> files(line.size(), llama_opt_fd{ -1 });  // opened when first read
    uint32_t k = first;
    for (; k < last && k < e.chain.size(); ++k) {
        size_t owner = 0;
        while (owner < line.size() && k < line[owner].base_blocks) {
            ++owner;
        }
        if (owner == line.size()) {
            why  = "the entry holding block " + std::to_string(k) + " (a parent of " + e.path + ") is gone";
            miss = llama_opt_persist_miss::not_stored;
            return k - first;
        }
        llama_opt_fd & f = files[owner];
        if (f.fd < 0) {
            f.fd = open(line[owner].path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        }
        if (f.fd < 0) {
            why  = llama_opt_errno_text("cannot open " + line[owner].path);
            miss = llama_opt_persist_miss::not_stored;  // another process cleaned it up
            return k - first;
        }
        const std::string problem =
            llama_opt_persist_read_block(f.fd, line[owner], k, dst + (uint64_t) (k - first) * block_bytes);
        if (!problem.empty()) {
            why  = problem + " of " + line[owner].path;
            miss = llama_opt_persist_miss::corrupt;
            remove(line[owner].path);  // (its descendants, orphans now, go with the next cleanup)
            return k - first;
        }
    }
    if (k < last) {
        why  = "short entry";
        miss = llama_opt_persist_miss::corrupt;
        remove(e.path);
        return k - first;
    }
    touch_lineage(line);
    return k - first;
}

bool llama_opt_persist_store::save(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                   const std::vector<uint64_t> & chain, const uint8_t * rows, std::string & why,
                                   uint64_t max_bytes) const {
    return save_extending(layout, tokens, chain, nullptr, 0, rows, why, max_bytes) > 0;
}

uint64_t llama_opt_persist_store::save_extending(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                                 const std::vector<uint64_t> & chain, const llama_opt_persist_entry * base,
                                                 uint32_t n_base, const uint8_t * rows, std::string & why,
                                                 uint64_t max_bytes) const {
    const uint64_t n_blocks = chain.size();
    if (n_blocks == 0 || tokens.size() != n_blocks * layout.block_size) {
        why = "nothing to store: no complete block";
        return 0;
    }
    if (n_base > 0 && (!base || base->layout != layout || base->chain.size() < n_base || n_base >= n_blocks ||
                       !std::equal(chain.begin(), chain.begin() + n_base, base->chain.begin()))) {
        why = "internal error: the base entry does not hold the context's first blocks";
        return 0;
    }
    if (!llama_opt_persist_prepare_dir(dir_, why)) {
        return 0;
    }
    const uint64_t block_bytes = layout.block_bytes();
    // an entry ending where this context's first blocks end is its parent; within a longer one (a
    // branch of its context) they are read and written whole
    std::vector<uint8_t> whole;
    if (n_base > 0 && (base->chain.size() > n_base || base->path != dir_ + "/" + llama_opt_persist_entry_name(layout, chain[n_base - 1]))) {
        whole.resize(n_blocks * block_bytes);
        llama_opt_persist_miss miss;
        if (load(*base, 0, n_base, whole.data(), why, miss) != n_base) {
            why = "the entry holding its first blocks is gone: " + why;
            return 0;
        }
        std::copy(rows, rows + (n_blocks - n_base) * block_bytes, whole.begin() + n_base * block_bytes);
        rows   = whole.data();
        n_base = 0;
    }
    const uint64_t file_size = llama_opt_persist_file_size(layout, n_blocks, n_base);
    if (max_bytes > 0 && file_size > max_bytes) {
        why = "the entry (" + std::to_string(file_size >> 20) + " MiB) is larger than the size budget (" +
              std::to_string(max_bytes >> 20) + " MiB, persist_max_mb)";
        return 0;
    }
    if (n_base > 0) {
        struct stat st;
        if (lstat(base->path.c_str(), &st) != 0 || (uint64_t) st.st_size != base->file_size) {
            why = "the entry holding its first blocks is gone: " + base->path;  // removed (or replaced) meanwhile
            return 0;
        }
    }
    const std::string name = llama_opt_persist_entry_name(layout, chain.back());
    const std::string path = dir_ + "/" + name;
    const auto        fill = [&](const llama_opt_persist_writer & write) {
        const uint64_t n_own = n_blocks - n_base;
        const uint64_t data =
            llama_opt_persist_write_meta(layout, tokens, chain, llama_opt_persist_block_checksums(layout, rows, n_own), write);
        return data > 0 && write(rows, n_own * block_bytes, data);
    };
    if (!write_atomically(name, fill, why)) {
        return 0;
    }
    if (n_base > 0) {
        llama_opt_persist_entry written;
        if (llama_opt_persist_read_header(path, written, nullptr)) {
            touch_lineage(lineage(written));  // its parents are used as long as it is
        }
    }
    remove_subsumed(layout, chain, path);
    if (max_bytes > 0) {
        cleanup(0, max_bytes, path);
    }
    return file_size;
}

void llama_opt_persist_store::remove_subsumed(const llama_opt_persist_layout & layout, const std::vector<uint64_t> & chain,
                                              const std::string & path) const {
    // entries holding a prefix of this context are subsumed: it restores those prefixes too; but
    // an entry another one extends stays (its rows are that one's too)
    for (bool removed = true; removed;) {
        removed = false;
        const std::vector<llama_opt_persist_entry> entries = list();
        const std::set<std::string>                parents = parent_paths(entries);
        for (const llama_opt_persist_entry & e : entries) {
            if (e.problem.empty() && e.path != path && e.layout == layout && e.chain.size() < chain.size() &&
                std::equal(e.chain.begin(), e.chain.end(), chain.begin()) && !parents.count(e.path)) {
                removed |= remove(e.path);
            }
        }
    }
}

std::string llama_opt_persist_store::parent_path(const llama_opt_persist_entry & e) const {
    return e.base_blocks > 0 ? dir_ + "/" + llama_opt_persist_entry_name(e.layout, e.chain[e.base_blocks - 1]) : "";
}

std::set<std::string> llama_opt_persist_store::parent_paths(const std::vector<llama_opt_persist_entry> & entries) const {
    std::set<std::string> parents;
    for (const llama_opt_persist_entry & e : entries) {
        if (e.problem.empty() && e.base_blocks > 0) {
            parents.insert(parent_path(e));
        }
    }
    return parents;
}

void llama_opt_persist_store::touch_lineage(const std::vector<llama_opt_persist_entry> & line) const {
    for (const llama_opt_persist_entry & e : line) {  // the child first: parents are never older than their children
        touch_file(e.path);
    }
}

bool llama_opt_persist_store::write_atomically(const std::string & name, const std::function<bool(const llama_opt_persist_writer &)> & fill,
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
    const llama_opt_persist_writer out = [&](const void * src, uint64_t n, uint64_t offset) {
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
    for (size_t k = e.base_blocks; k < e.chain.size(); ++k) {
        const std::string problem = llama_opt_persist_read_block(f.fd, e, k, block.data());
        if (!problem.empty()) {
            return problem;
        }
    }
    if (e.base_blocks > 0 && lineage(e).size() < 2) {
        return "its parent entry (blocks 0-" + std::to_string(e.base_blocks - 1) + ") is missing: " + parent_path(e);
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
    std::map<std::string, const llama_opt_persist_entry *> present;
    uint64_t total = 0;
    for (const auto & e : entries) {
        total += e.file_size;
        present[e.path] = &e;
    }
    std::set<std::string> kept{ keep };  // and its ancestors: it needs them
    for (auto it = present.find(keep); it != present.end() && it->second->base_blocks > 0;
         it = present.find(parent_path(*it->second))) {
        kept.insert(parent_path(*it->second));
    }
    const auto drop = [&](const llama_opt_persist_entry & e) {
        if (remove(e.path)) {
            total -= e.file_size;
            ++removed;
        }
        present.erase(e.path);
    };
    // an extension whose parent is gone holds nothing restorable: removed with it, at once, so
    // that the size budget counts what is left
    const auto drop_orphans = [&]() {
        for (bool again = true; again;) {
            again = false;
            for (const auto & e : entries) {
                if (e.problem.empty() && e.base_blocks > 0 && present.count(e.path) && !present.count(parent_path(e))) {
                    drop(e);
                    again = true;
                }
            }
        }
    };
    drop_orphans();
    for (const auto & e : entries) {
        const bool broken = !e.problem.empty() && e.problem.rfind("cannot read", 0) != 0 && e.problem != "not a regular file";
        const bool old    = max_age_s > 0 && now - e.mtime > max_age_s;
        const bool over   = max_bytes > 0 && total > max_bytes;
        if ((broken || old || over) && present.count(e.path) && !kept.count(e.path)) {
            drop(e);
            drop_orphans();
        }
    }
    return removed;
}

bool llama_opt_persist_store::remove(const std::string & path) const {
    return unlink(path.c_str()) == 0;
}

void llama_opt_persist_store::touch(const std::string & path) const {
    llama_opt_persist_entry e;
    if (llama_opt_persist_read_header(path, e, nullptr) && e.base_blocks > 0) {
        touch_lineage(lineage(e));
        return;
    }
    touch_file(path);
}

void llama_opt_persist_store::touch_file(const std::string & path) const {
    utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // gone meanwhile: nothing to keep
}
