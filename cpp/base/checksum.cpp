#include "base/checksum.h"

#include <cstring>

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
