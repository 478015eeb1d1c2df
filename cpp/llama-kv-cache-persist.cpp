#include "llama-kv-cache-persist.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <stdexcept>

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the persist format is little-endian; this host is not"
#endif

static constexpr char     MAGIC[8]      = { 'L', 'L', 'A', 'M', 'A', 'K', 'V', '\0' };
static constexpr uint32_t VERSION       = 1;
static constexpr uint64_t DATA_ALIGN    = 4096;
static constexpr char     SUFFIX[]      = ".llkv";
static constexpr char     TMP_PREFIX[]  = ".tmp-";
static constexpr int64_t  TMP_STALE_S   = 3600;

// The fixed header at offset 0 (docs/persist-format.md).
struct file_header {
    char     magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t model_hash;
    uint64_t compat_hash;
    uint64_t context_hash;
    uint32_t n_tokens;
    uint32_t block_size;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t k_dim;
    uint32_t v_dim;
    int32_t  k_type;
    int32_t  v_type;
    uint64_t bytes_per_token;
    uint64_t tokens_offset;     // n_tokens int32 token ids
    uint64_t chain_offset;      // n_blocks uint64 chained block hashes
    uint64_t checksums_offset;  // n_blocks uint64 checksums of each block's rows
    uint64_t data_offset;       // rows, position-major; block k at data_offset + k * block_bytes
    uint64_t file_size;
    uint64_t meta_checksum;     // of this header (with this field 0), tokens, chain and checksums
};
static_assert(sizeof(file_header) == 128, "the header layout is part of the format");

uint64_t llama_opt_checksum(const void * data, size_t n_bytes, uint64_t seed) {
    constexpr uint64_t P1 = 0x9e3779b185ebca87ULL, P2 = 0xc2b2ae3d27d4eb4fULL;
    auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
    const uint8_t * p = (const uint8_t *) data;
    uint64_t h = seed ^ (P2 * (n_bytes + 1));
    size_t i = 0;
    for (; i + 8 <= n_bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = rotl(h ^ (w * P1), 31) * P2;
    }
    uint64_t tail = 0;
    memcpy(&tail, p + i, n_bytes - i);
    h = rotl(h ^ (tail * P1), 31) * P2;
    h ^= h >> 33;
    h *= P1;
    h ^= h >> 29;
    return h;
}

bool llama_opt_persist_layout::operator==(const llama_opt_persist_layout & o) const {
    return model_hash == o.model_hash && compat_hash == o.compat_hash && block_size == o.block_size &&
           n_layers == o.n_layers && n_kv_heads == o.n_kv_heads && k_dim == o.k_dim && v_dim == o.v_dim &&
           k_type == o.k_type && v_type == o.v_type && bytes_per_token == o.bytes_per_token;
}

std::string llama_opt_persist_default_dir() {
    const char * xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') {  // the XDG spec: a relative path is ignored
        return std::string(xdg) + "/pyllamaopt/kv";
    }
    const char * home = getenv("HOME");
    std::string  base = home && home[0] == '/' ? home : "";
    if (base.empty()) {  // a service without HOME: the account's home
        const passwd * pw = getpwuid(geteuid());
        base = pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : "";
    }
    if (base.empty() || base == "/") {  // no home of its own: not a directory others share (/tmp/.cache)
        return "/tmp/pyllamaopt-" + std::to_string(geteuid()) + "/kv";
    }
    return base + "/.cache/pyllamaopt/kv";
}

namespace {

bool ends_with(const std::string & s, const char * suffix) {
    const size_t n = strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool starts_with(const std::string & s, const char * prefix) {
    return s.compare(0, strlen(prefix), prefix) == 0;
}

std::string errno_text(const std::string & what) {
    return what + ": " + strerror(errno);
}

// Reads exactly n bytes at offset (false on a short read or an error).
bool pread_all(int fd, void * dst, size_t n, uint64_t offset) {
    uint8_t * p = (uint8_t *) dst;
    while (n > 0) {
        const ssize_t r = pread(fd, p, n, (off_t) offset);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        p += r;
        n -= (size_t) r;
        offset += (uint64_t) r;
    }
    return true;
}

struct fd_guard {
    int fd;
    ~fd_guard() {
        if (fd >= 0) {
            close(fd);
        }
    }
};

// Creates dir and its missing parents 0700 (the entries hold prompts' token ids in plain).
bool make_dirs(const std::string & dir, std::string & why) {
    std::string path;
    for (size_t i = 0; i <= dir.size(); ++i) {
        if (i == dir.size() || (dir[i] == '/' && i > 0)) {
            path = dir.substr(0, i);
            if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
                why = errno_text("cannot create " + path) + "; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory you can write";
                return false;
            }
        }
    }
    return llama_opt_persist_check_dir(dir, why);
}

std::vector<std::string> dir_files(const std::string & dir) {
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

std::string hex(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long) v);
    return buf;
}

uint64_t meta_checksum(file_header h, const std::vector<llama_token> & tokens, const std::vector<uint64_t> & chain,
                       const std::vector<uint64_t> & sums) {
    h.meta_checksum = 0;
    uint64_t c = llama_opt_checksum(&h, sizeof(h));
    c = llama_opt_checksum(tokens.data(), tokens.size() * sizeof(llama_token), c);
    c = llama_opt_checksum(chain.data(), chain.size() * sizeof(uint64_t), c);
    return llama_opt_checksum(sums.data(), sums.size() * sizeof(uint64_t), c);
}

}  // namespace

llama_opt_persist_store::llama_opt_persist_store(std::string dir) : dir_(std::move(dir)) {}

bool llama_opt_persist_prepare_dir(const std::string & dir, std::string & why) {
    return make_dirs(dir, why);
}

bool llama_opt_persist_check_dir(const std::string & dir, std::string & why) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) {
        why = errno_text("cannot use " + dir) + "; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory you can write";
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        why = dir + " is not a directory; remove it or set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory";
        return false;
    }
    if (st.st_uid != geteuid()) {
        why = dir + " is owned by another user (uid " + std::to_string(st.st_uid) + "): whoever owns it can plant KV "
              "that passes every checksum; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory of your own";
        return false;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        why = dir + " is writable by other users: they could plant KV that passes every checksum; "
              "run `chmod 700 " + dir + "` (and clear it with `pyllamaopt cache clean --all --dir " + dir + "` if you do not trust it)";
        return false;
    }
    if ((st.st_mode & 0077) != 0 && chmod(dir.c_str(), 0700) != 0) {
        // readable by others (0755 from older versions): ours, so tightened, since the entries hold prompts
        why = errno_text("cannot make " + dir + " private") + "; run `chmod 700 " + dir + "`";
        return false;
    }
    return true;
}

bool llama_opt_persist_store::read_header(const std::string & path, llama_opt_persist_entry & e,
                                          std::vector<llama_token> * tokens) const {
    e      = llama_opt_persist_entry();
    e.path = path;
    struct stat lst;
    if (lstat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) {
        // never followed out of the directory: cleanup() and verify(remove=True) unlink the link itself
        e.problem = S_ISLNK(lst.st_mode) ? "a symbolic link (not followed)" : "not a regular file";
        return false;
    }
    fd_guard f{ open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    struct stat st;
    if (f.fd < 0 || fstat(f.fd, &st) != 0) {
        e.problem = errno_text("cannot read");
        return false;
    }
    e.file_size = (uint64_t) st.st_size;
    e.mtime     = (int64_t) st.st_mtime;
    e.mtime_ns  = (int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    file_header h;
    if (!pread_all(f.fd, &h, sizeof(h), 0) || memcmp(h.magic, MAGIC, sizeof(MAGIC)) != 0) {
        e.problem = "not a pyllamaopt KV file";
        return false;
    }
    if (h.version != VERSION || h.header_size != sizeof(h)) {
        e.problem = "format version " + std::to_string(h.version) + ", this build reads " + std::to_string(VERSION);
        return false;
    }
    const uint64_t n_blocks = h.block_size ? h.n_tokens / h.block_size : 0;
    // the size of the rows without wrapping around 2^64: a header whose sizes wrap to the real
    // file size would otherwise pass, and the tables be allocated for its n_tokens (fuzz-persist)
    uint64_t block_bytes = 0, data_bytes = 0, data_end = 0;
    const bool sizes_fit = !__builtin_mul_overflow((uint64_t) h.block_size, h.bytes_per_token, &block_bytes) &&
                           !__builtin_mul_overflow(n_blocks, block_bytes, &data_bytes) &&
                           !__builtin_add_overflow(h.data_offset, data_bytes, &data_end);
    const bool sane = h.block_size > 0 && h.n_tokens % h.block_size == 0 && n_blocks > 0 && sizes_fit &&
                      h.tokens_offset == sizeof(h) && h.chain_offset == h.tokens_offset + 4 * (uint64_t) h.n_tokens &&
                      h.checksums_offset == h.chain_offset + 8 * n_blocks && h.data_offset >= h.checksums_offset + 8 * n_blocks &&
                      h.bytes_per_token > 0 && h.file_size == data_end;
    if (!sane) {
        e.problem = "inconsistent header";
        return false;
    }
    if (e.file_size != h.file_size) {  // (so the tables below lie inside the file and are no larger than it)
        e.problem = (e.file_size < h.file_size ? "truncated: " : "longer than its header says: ") +
                    std::to_string(e.file_size) + " of " + std::to_string(h.file_size) + " bytes";
        return false;
    }
    std::vector<llama_token> toks(h.n_tokens);
    std::vector<uint64_t>    sums(n_blocks);
    e.chain.resize(n_blocks);
    if (!pread_all(f.fd, toks.data(), toks.size() * sizeof(llama_token), h.tokens_offset) ||
        !pread_all(f.fd, e.chain.data(), n_blocks * 8, h.chain_offset) ||
        !pread_all(f.fd, sums.data(), n_blocks * 8, h.checksums_offset)) {
        e.problem = "unreadable header";
        return false;
    }
    if (meta_checksum(h, toks, e.chain, sums) != h.meta_checksum) {
        e.problem = "header checksum mismatch";
        return false;
    }
    e.layout       = { h.model_hash, h.compat_hash, h.block_size, h.n_layers, h.n_kv_heads, h.k_dim, h.v_dim,
                       h.k_type, h.v_type, h.bytes_per_token };
    e.context_hash = h.context_hash;
    e.n_tokens     = h.n_tokens;
    e.checksums    = std::move(sums);
    e.data_offset  = h.data_offset;
    if (tokens) {
        *tokens = std::move(toks);
    }
    return true;
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
    for (const std::string & name : dir_files(dir_)) {
        if (!ends_with(name, SUFFIX) || starts_with(name, TMP_PREFIX)) {
            continue;
        }
        llama_opt_persist_entry  e;
        std::vector<llama_token> stored;
        if (!read_header(dir_ + "/" + name, e, &stored)) {
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
    const uint64_t block_bytes = (uint64_t) e.layout.block_size * e.layout.bytes_per_token;
    miss = llama_opt_persist_miss::none;
    fd_guard f{ open(e.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    if (f.fd < 0) {
        why  = errno_text("cannot open " + e.path);
        miss = llama_opt_persist_miss::not_stored;  // another process cleaned it up
        return 0;
    }
    uint32_t k = first;
    for (; k < last && k < e.checksums.size(); ++k) {
        uint8_t * block = dst + (uint64_t) (k - first) * block_bytes;
        if (!pread_all(f.fd, block, block_bytes, e.data_offset + k * block_bytes)) {
            why = "short read in block " + std::to_string(k);
            break;
        }
        if (llama_opt_checksum(block, block_bytes) != e.checksums[k]) {
            why = "checksum mismatch in block " + std::to_string(k);
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
    const uint64_t n_blocks = chain.size();
    if (n_blocks == 0 || tokens.size() != n_blocks * layout.block_size) {
        why = "nothing to store: no complete block";
        return false;
    }
    if (!make_dirs(dir_, why)) {
        return false;
    }
    const uint64_t block_bytes = (uint64_t) layout.block_size * layout.bytes_per_token;
    std::vector<uint64_t> sums(n_blocks);
    for (uint64_t k = 0; k < n_blocks; ++k) {
        sums[k] = llama_opt_checksum(rows + k * block_bytes, block_bytes);
    }
    file_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, MAGIC, sizeof(MAGIC));
    h.version          = VERSION;
    h.header_size      = sizeof(h);
    h.model_hash       = layout.model_hash;
    h.compat_hash      = layout.compat_hash;
    h.context_hash     = chain.back();
    h.n_tokens         = (uint32_t) tokens.size();
    h.block_size       = layout.block_size;
    h.n_layers         = layout.n_layers;
    h.n_kv_heads       = layout.n_kv_heads;
    h.k_dim            = layout.k_dim;
    h.v_dim            = layout.v_dim;
    h.k_type           = layout.k_type;
    h.v_type           = layout.v_type;
    h.bytes_per_token  = layout.bytes_per_token;
    h.tokens_offset    = sizeof(h);
    h.chain_offset     = h.tokens_offset + 4 * (uint64_t) tokens.size();
    h.checksums_offset = h.chain_offset + 8 * n_blocks;
    h.data_offset      = (h.checksums_offset + 8 * n_blocks + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
    h.file_size        = h.data_offset + n_blocks * block_bytes;
    h.meta_checksum    = meta_checksum(h, tokens, chain, sums);
    if (max_bytes > 0 && h.file_size > max_bytes) {
        why = "the entry (" + std::to_string(h.file_size >> 20) + " MiB) is larger than the size budget (" +
              std::to_string(max_bytes >> 20) + " MiB, persist_max_mb)";
        return false;
    }

    static std::atomic<uint64_t> counter{ 0 };
    const std::string name = hex(h.context_hash) + "-" + hex(layout.model_hash ^ layout.compat_hash) + SUFFIX;
    const std::string path = dir_ + "/" + name;
    // the pid and a random part: a process killed mid-save leaves its file, and a later one with the
    // same pid (the first process of a restarted container) must not find its name taken
    const std::string tmp  = dir_ + "/" + TMP_PREFIX + name + "." + std::to_string(getpid()) + "." +
                            hex(std::random_device{}() ^ ((uint64_t) std::random_device{}() << 32)) + "." +
                            std::to_string(counter++);

    fd_guard f{ open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600) };
    if (f.fd < 0) {
        why = errno_text("cannot write in " + dir_);
        return false;
    }
    uint64_t written = 0;
    auto put = [&](const void * src, uint64_t n, uint64_t offset) {
        const uint8_t * p = (const uint8_t *) src;
        while (n > 0) {
            size_t chunk = (size_t) std::min<uint64_t>(n, 1 << 24);
            if (fail_after_ && written + chunk > fail_after_) {
                chunk = (size_t) (fail_after_ > written ? fail_after_ - written : 0);
                if (chunk == 0) {
                    errno = ENOSPC;  // the test hook: a full disk
                    return false;
                }
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
    const bool ok = put(&h, sizeof(h), 0) && put(tokens.data(), 4 * tokens.size(), h.tokens_offset) &&
                    put(chain.data(), 8 * n_blocks, h.chain_offset) && put(sums.data(), 8 * n_blocks, h.checksums_offset) &&
                    put(rows, n_blocks * block_bytes, h.data_offset) && fsync(f.fd) == 0;
    if (!ok) {
        why = errno_text("cannot write " + tmp);
        unlink(tmp.c_str());
        return false;
    }
    close(f.fd);
    f.fd = -1;
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        why = errno_text("cannot rename " + tmp);
        unlink(tmp.c_str());
        return false;
    }
    fd_guard d{ open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
    if (d.fd >= 0) {
        fsync(d.fd);  // the rename itself survives a crash
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

std::vector<llama_opt_persist_entry> llama_opt_persist_store::list() const {
    std::vector<llama_opt_persist_entry> entries;
    for (const std::string & name : dir_files(dir_)) {
        if (ends_with(name, SUFFIX) && !starts_with(name, TMP_PREFIX)) {
            llama_opt_persist_entry e;
            read_header(dir_ + "/" + name, e, nullptr);
            entries.push_back(std::move(e));
        }
    }
    return entries;
}

std::string llama_opt_persist_store::verify(const std::string & path) const {
    llama_opt_persist_entry e;
    if (!read_header(path, e, nullptr)) {
        return e.problem;
    }
    const uint64_t block_bytes = (uint64_t) e.layout.block_size * e.layout.bytes_per_token;
    std::vector<uint8_t> block(block_bytes);
    fd_guard f{ open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    for (size_t k = 0; k < e.checksums.size(); ++k) {
        if (f.fd < 0 || !pread_all(f.fd, block.data(), block_bytes, e.data_offset + k * block_bytes)) {
            return "short read in block " + std::to_string(k);
        }
        if (llama_opt_checksum(block.data(), block_bytes) != e.checksums[k]) {
            return "checksum mismatch in block " + std::to_string(k);
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

bool llama_opt_same_file_version(const struct stat & a, const struct stat & b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
           a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
           a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// git's "racy" rule: a file written just before it was read could be written again within its
// timestamps' granularity without its times changing, and a remembered hash of the old content would
// then name the new one. So a hash is remembered only if the file's times are older than `read_start`
// by more than that granularity: 2 s where they have no sub-second part (FAT's 2 s, ext2's or
// HFS+'s 1 s), else 100 ms (ext4 and others stamp from a clock of a few ms).
static bool settled_before(const struct stat & st, const timespec & read_start) {
    const auto ns = [](const timespec & t) { return (int64_t) t.tv_sec * 1000000000 + t.tv_nsec; };
    const bool    whole_seconds = st.st_mtim.tv_nsec == 0 && st.st_ctim.tv_nsec == 0;
    const int64_t granularity   = whole_seconds ? 2000000000 : 100000000;
    return std::max(ns(st.st_mtim), ns(st.st_ctim)) + granularity < ns(read_start);
}

uint64_t llama_opt_file_hash(const std::string & path, const std::string & memo_dir, const struct stat & loaded) {
    const auto changed = [&] {
        return std::runtime_error(path + " is no longer the file the model was loaded from (replaced or written since): "
                                  "load the model again");
    };
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        throw std::runtime_error(errno_text("cannot read " + path));
    }
    if (!llama_opt_same_file_version(st, loaded)) {
        throw changed();
    }
    char key[4096 + 160];
    snprintf(key, sizeof(key), "%llu:%llu %llu %lld.%09ld %lld.%09ld %s", (unsigned long long) st.st_dev,
             (unsigned long long) st.st_ino, (unsigned long long) st.st_size, (long long) st.st_mtim.tv_sec,
             (long) st.st_mtim.tv_nsec, (long long) st.st_ctim.tv_sec, (long) st.st_ctim.tv_nsec, path.c_str());
    const std::string memo = memo_dir + "/file-hashes";
    struct stat mst;
    const bool memo_ok = lstat(memo.c_str(), &mst) == 0 && S_ISREG(mst.st_mode);  // never a link
    if (FILE * f = memo_ok ? fopen(memo.c_str(), "r") : nullptr) {
        char line[sizeof(key) + 32];
        unsigned long long found = 0;
        bool hit = false;
        while (fgets(line, sizeof(line), f)) {
            unsigned long long h;
            int n = 0;
            if (sscanf(line, "%16llx %n", &h, &n) == 1 && strncmp(line + n, key, strlen(key)) == 0 &&
                line[n + strlen(key)] == '\n') {
                found = h;
                hit   = true;
            }
        }
        fclose(f);
        if (hit) {
            return found;
        }
    }
    timespec read_start{};
    clock_gettime(CLOCK_REALTIME, &read_start);
    fd_guard in{ open(path.c_str(), O_RDONLY | O_CLOEXEC) };
    if (in.fd < 0) {
        throw std::runtime_error(errno_text("cannot read " + path));
    }
    if (fstat(in.fd, &st) != 0 || !llama_opt_same_file_version(st, loaded)) {
        throw changed();  // replaced between the stat above and the open
    }
    std::vector<uint8_t> buf(1 << 23);
    uint64_t h = 0;
    for (uint64_t offset = 0;;) {
        const ssize_t r = pread(in.fd, buf.data(), buf.size(), (off_t) offset);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            throw std::runtime_error(errno_text("cannot read " + path));
        }
        if (r == 0) {
            break;
        }
        h = llama_opt_checksum(buf.data(), (size_t) r, h);
        offset += (uint64_t) r;
    }
    std::string ignored;
    if (settled_before(st, read_start) && make_dirs(memo_dir, ignored)) {
        fd_guard out{ open(memo.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600) };
        const std::string line = hex(h) + " " + key + "\n";
        if (out.fd >= 0 && write(out.fd, line.data(), line.size()) < 0) {
            // a memo we cannot write only costs reading the file again next time
        }
    }
    return h;
}
