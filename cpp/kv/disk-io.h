#pragma once

// kv/disk-io: the POSIX file helpers the disk tier's files share (its entries,
// its directory, the model checksum memo).

#include <cstddef>
#include <cstdint>
#include <string>

// Closes its descriptor when it goes out of scope (-1: none).
struct llama_opt_fd {
    int fd;
    ~llama_opt_fd();
};

// Reads exactly n bytes at offset (false on a short read or an error).
bool llama_opt_pread_all(int fd, void * dst, size_t n, uint64_t offset);

// "what: <strerror(errno)>"
std::string llama_opt_errno_text(const std::string & what);

// v as 16 lower-case hex digits (entry names, the memo's lines)
std::string llama_opt_hex(uint64_t v);
