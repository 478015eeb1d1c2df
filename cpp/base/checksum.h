#pragma once

// base/checksum: the 64-bit checksum of the disk tier's format (docs/persist-format.md),
// also the model's identity (its file's checksum) and a grammar's (its text's).

#include <cstddef>
#include <cstdint>

// Fast 64-bit checksum of bytes (word-wise multiply-rotate; any change of one 8-byte word
// changes the result). Not cryptographic: it guards against corruption, not attackers.
uint64_t llama_opt_checksum(const void * data, size_t n_bytes, uint64_t seed = 0);
