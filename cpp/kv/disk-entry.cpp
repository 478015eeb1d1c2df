#include "kv/disk-entry.h"

#include "kv/disk-io.h"
#include "base/checksum.h"

#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the persist format is little-endian; this host is not"
#endif

static constexpr char     MAGIC[8]   = { 'L', 'L', 'A', 'M', 'A', 'K', 'V', '\0' };
static constexpr uint32_t VERSION    = 1;  // an entry holding all its blocks' rows
static constexpr uint32_t VERSION_EXTENSION = 2;  // one extending a parent entry: the header grows by base_blocks
static constexpr uint64_t DATA_ALIGN = 4096;
static constexpr char     SUFFIX[]   = ".llkv";

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

// The header of either version: version 1 ends at `base_blocks` (which is 0 for it).
struct any_header {
    file_header fixed;
    uint32_t    base_blocks;  // version 2: blocks [0, base_blocks) are the parent entry's
    uint32_t    reserved;
    uint64_t size() const { return fixed.version == VERSION ? sizeof(file_header) : sizeof(any_header); }
};
static_assert(sizeof(any_header) == 136, "the header layout is part of the format");

bool llama_opt_persist_layout::operator==(const llama_opt_persist_layout & o) const {
    return model_hash == o.model_hash && compat_hash == o.compat_hash && block_size == o.block_size &&
           n_layers == o.n_layers && n_kv_heads == o.n_kv_heads && k_dim == o.k_dim && v_dim == o.v_dim &&
           k_type == o.k_type && v_type == o.v_type && bytes_per_token == o.bytes_per_token;
}

std::string llama_opt_persist_entry_name(const llama_opt_persist_layout & layout, uint64_t context_hash) {
    return llama_opt_hex(context_hash) + "-" + llama_opt_hex(layout.model_hash ^ layout.compat_hash) + SUFFIX;
}

bool llama_opt_persist_has_entry_suffix(const std::string & name) {
    const size_t n = strlen(SUFFIX);
    return name.size() >= n && name.compare(name.size() - n, n, SUFFIX) == 0;
}

static uint64_t meta_checksum(any_header h, const std::vector<llama_token> & tokens, const std::vector<uint64_t> & chain,
                              const std::vector<uint64_t> & sums) {
    h.fixed.meta_checksum = 0;
    uint64_t c = llama_opt_checksum(&h, h.size());
    c = llama_opt_checksum(tokens.data(), tokens.size() * sizeof(llama_token), c);
    c = llama_opt_checksum(chain.data(), chain.size() * sizeof(uint64_t), c);
    return llama_opt_checksum(sums.data(), sums.size() * sizeof(uint64_t), c);
}

// The header of an entry of n_blocks blocks whose first base_blocks are its parent's, but for its
// context hash and meta checksum.
static any_header layout_header(const llama_opt_persist_layout & layout, uint64_t n_blocks, uint64_t base_blocks) {
    const uint64_t n_tokens = n_blocks * layout.block_size;
    const uint64_t n_own    = n_blocks - base_blocks;
    any_header whole;
    memset(&whole, 0, sizeof(whole));
    file_header & h = whole.fixed;
    memcpy(h.magic, MAGIC, sizeof(MAGIC));
    h.version          = base_blocks > 0 ? VERSION_EXTENSION : VERSION;
    whole.base_blocks  = (uint32_t) base_blocks;
    h.header_size      = (uint32_t) whole.size();
    h.model_hash       = layout.model_hash;
    h.compat_hash      = layout.compat_hash;
    h.n_tokens         = (uint32_t) n_tokens;
    h.block_size       = layout.block_size;
    h.n_layers         = layout.n_layers;
    h.n_kv_heads       = layout.n_kv_heads;
    h.k_dim            = layout.k_dim;
    h.v_dim            = layout.v_dim;
    h.k_type           = layout.k_type;
    h.v_type           = layout.v_type;
    h.bytes_per_token  = layout.bytes_per_token;
    h.tokens_offset    = h.header_size;
    h.chain_offset     = h.tokens_offset + 4 * n_tokens;
    h.checksums_offset = h.chain_offset + 8 * n_blocks;
    h.data_offset      = (h.checksums_offset + 8 * n_own + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
    h.file_size        = h.data_offset + n_own * layout.block_bytes();
    return whole;
}

uint64_t llama_opt_persist_file_size(const llama_opt_persist_layout & layout, uint64_t n_blocks, uint64_t base_blocks) {
    return layout_header(layout, n_blocks, base_blocks).fixed.file_size;
}

std::vector<uint64_t> llama_opt_persist_block_checksums(const llama_opt_persist_layout & layout, const uint8_t * rows,
                                                        uint64_t n_blocks) {
    const uint64_t block_bytes = layout.block_bytes();
    std::vector<uint64_t> sums(n_blocks);
    for (uint64_t k = 0; k < n_blocks; ++k) {
        sums[k] = llama_opt_checksum(rows + k * block_bytes, block_bytes);
    }
    return sums;
}

uint64_t llama_opt_persist_write_meta(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                      const std::vector<uint64_t> & chain, const std::vector<uint64_t> & sums,
                                      const llama_opt_persist_writer & write) {
    const uint64_t n_blocks = chain.size();
    any_header     whole    = layout_header(layout, n_blocks, n_blocks - sums.size());
    file_header &  h        = whole.fixed;
    h.context_hash  = chain.back();
    h.meta_checksum = meta_checksum(whole, tokens, chain, sums);
    const bool ok = write(&whole, whole.size(), 0) && write(tokens.data(), 4 * tokens.size(), h.tokens_offset) &&
                    write(chain.data(), 8 * n_blocks, h.chain_offset) && write(sums.data(), 8 * sums.size(), h.checksums_offset);
    return ok ? h.data_offset : 0;
}

bool llama_opt_persist_write_entry(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                   const std::vector<uint64_t> & chain, const uint8_t * rows,
                                   const llama_opt_persist_writer & write) {
    const uint64_t n_blocks    = chain.size();
    const uint64_t data_offset =
        llama_opt_persist_write_meta(layout, tokens, chain, llama_opt_persist_block_checksums(layout, rows, n_blocks), write);
    return data_offset > 0 && write(rows, n_blocks * layout.block_bytes(), data_offset);
}

bool llama_opt_persist_read_header(const std::string & path, llama_opt_persist_entry & e,
                                   std::vector<llama_token> * tokens) {
    e      = llama_opt_persist_entry();
    e.path = path;
    struct stat lst;
    if (lstat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) {
        // never followed out of the directory: cleanup() and verify(remove=True) unlink the link itself
        e.problem = S_ISLNK(lst.st_mode) ? "a symbolic link (not followed)" : "not a regular file";
        return false;
    }
    llama_opt_fd f{ open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
    struct stat st;
    if (f.fd < 0 || fstat(f.fd, &st) != 0) {
        e.problem = llama_opt_errno_text("cannot read");
        return false;
    }
    e.file_size = (uint64_t) st.st_size;
    e.mtime     = (int64_t) st.st_mtime;
    e.mtime_ns  = (int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    any_header   whole;
    file_header & h = whole.fixed;
    memset(&whole, 0, sizeof(whole));
    if (!llama_opt_pread_all(f.fd, &h, sizeof(h), 0) || memcmp(h.magic, MAGIC, sizeof(MAGIC)) != 0) {
        e.problem = "not a pyllamaopt KV file";
        return false;
    }
    if ((h.version != VERSION && h.version != VERSION_EXTENSION) || h.header_size != whole.size()) {
        e.problem = "format version " + std::to_string(h.version) + ", this build reads " + std::to_string(VERSION) +
                    " and " + std::to_string(VERSION_EXTENSION);
        return false;
    }
    if (h.version == VERSION_EXTENSION &&
        !llama_opt_pread_all(f.fd, &whole.base_blocks, sizeof(whole) - sizeof(h), sizeof(h))) {
        e.problem = "unreadable header";
        return false;
    }
    const uint64_t n_blocks = h.block_size ? h.n_tokens / h.block_size : 0;
    const uint64_t n_base   = whole.base_blocks;
    const uint64_t n_own    = n_blocks - n_base;  // (checked below: n_base < n_blocks)
    // the size of the rows without wrapping around 2^64: a header whose sizes wrap to the real
    // file size would otherwise pass, and the tables be allocated for its n_tokens (fuzz-persist)
    uint64_t block_bytes = 0, data_bytes = 0, data_end = 0;
    const bool sizes_fit = !__builtin_mul_overflow((uint64_t) h.block_size, h.bytes_per_token, &block_bytes) &&
                           !__builtin_mul_overflow(n_own, block_bytes, &data_bytes) &&
                           !__builtin_add_overflow(h.data_offset, data_bytes, &data_end);
    const bool sane = h.block_size > 0 && h.n_tokens % h.block_size == 0 && n_blocks > 0 && n_base < n_blocks &&
                      (h.version == VERSION_EXTENSION) == (n_base > 0) && whole.reserved == 0 && sizes_fit &&
                      h.tokens_offset == whole.size() && h.chain_offset == h.tokens_offset + 4 * (uint64_t) h.n_tokens &&
                      h.checksums_offset == h.chain_offset + 8 * n_blocks && h.data_offset >= h.checksums_offset + 8 * n_own &&
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
    std::vector<uint64_t>    sums(n_own);
    e.chain.resize(n_blocks);
    if (!llama_opt_pread_all(f.fd, toks.data(), toks.size() * sizeof(llama_token), h.tokens_offset) ||
        !llama_opt_pread_all(f.fd, e.chain.data(), n_blocks * 8, h.chain_offset) ||
        !llama_opt_pread_all(f.fd, sums.data(), n_own * 8, h.checksums_offset)) {
        e.problem = "unreadable header";
        return false;
    }
    if (meta_checksum(whole, toks, e.chain, sums) != h.meta_checksum) {
        e.problem = "header checksum mismatch";
        return false;
    }
    e.layout       = { h.model_hash, h.compat_hash, h.block_size, h.n_layers, h.n_kv_heads, h.k_dim, h.v_dim,
                       h.k_type, h.v_type, h.bytes_per_token };
    e.context_hash = h.context_hash;
    e.n_tokens     = h.n_tokens;
    e.base_blocks  = (uint32_t) n_base;
    e.checksums    = std::move(sums);
    e.data_offset  = h.data_offset;
    if (tokens) {
        *tokens = std::move(toks);
    }
    return true;
}

std::string llama_opt_persist_read_block(int fd, const llama_opt_persist_entry & e, uint64_t k, uint8_t * dst) {
    const uint64_t block_bytes = e.layout.block_bytes();
    const uint64_t own         = k - e.base_blocks;  // (the caller reads only the entry's own blocks)
    if (!llama_opt_pread_all(fd, dst, block_bytes, e.data_offset + own * block_bytes)) {
        return "short read in block " + std::to_string(k);
    }
    if (llama_opt_checksum(dst, block_bytes) != e.checksums[own]) {
        return "checksum mismatch in block " + std::to_string(k);
    }
    return "";
}
