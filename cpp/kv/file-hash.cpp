#include "kv/file-hash.h"

#include "kv/disk-dir.h"
#include "kv/disk-io.h"
#include "base/checksum.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

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
        throw std::runtime_error(llama_opt_errno_text("cannot read " + path));
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
    llama_opt_fd in{ open(path.c_str(), O_RDONLY | O_CLOEXEC) };
    if (in.fd < 0) {
        throw std::runtime_error(llama_opt_errno_text("cannot read " + path));
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
            throw std::runtime_error(llama_opt_errno_text("cannot read " + path));
        }
        if (r == 0) {
            break;
        }
        h = llama_opt_checksum(buf.data(), (size_t) r, h);
        offset += (uint64_t) r;
    }
    std::string ignored;
    if (settled_before(st, read_start) && llama_opt_persist_prepare_dir(memo_dir, ignored)) {
        llama_opt_fd out{ open(memo.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600) };
        const std::string line = llama_opt_hex(h) + " " + key + "\n";
        if (out.fd >= 0 && write(out.fd, line.data(), line.size()) < 0) {
            // a memo we cannot write only costs reading the file again next time
        }
    }
    return h;
}
