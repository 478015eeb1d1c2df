#include "kv/disk-io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <unistd.h>

llama_opt_fd::~llama_opt_fd() {
    if (fd >= 0) {
        close(fd);
    }
}

bool llama_opt_pread_all(int fd, void * dst, size_t n, uint64_t offset) {
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

std::string llama_opt_errno_text(const std::string & what) {
    return what + ": " + strerror(errno);
}

std::string llama_opt_hex(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long) v);
    return buf;
}
