#include "methods/grammar-chars.h"

#include "llama-grammar.h"  // llama.cpp's internal grammar (src/)

#include <algorithm>

std::string llama_opt_utf8(int64_t cpt) {
    std::string s;
    if (cpt < 0x80) {
        s += (char) cpt;
    } else if (cpt < 0x800) {
        s += (char) (0xC0 | (cpt >> 6));
        s += (char) (0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        s += (char) (0xE0 | (cpt >> 12));
        s += (char) (0x80 | ((cpt >> 6) & 0x3F));
        s += (char) (0x80 | (cpt & 0x3F));
    } else {
        s += (char) (0xF0 | (cpt >> 18));
        s += (char) (0x80 | ((cpt >> 12) & 0x3F));
        s += (char) (0x80 | ((cpt >> 6) & 0x3F));
        s += (char) (0x80 | (cpt & 0x3F));
    }
    return s;
}

int64_t llama_opt_grammar_only_next_char(const llama_grammar & g) {
    if (g.partial_utf8.n_remain != 0) {
        return -1;  // inside a multi-byte character: not worth the bookkeeping
    }
    int64_t only = -1;
    for (const llama_grammar_stack & stack : g.stacks) {
        if (stack.empty()) {
            return -1;
        }
        const llama_grammar_element * e = stack.back();
        if (e->type != LLAMA_GRETYPE_CHAR || e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER || e[1].type == LLAMA_GRETYPE_CHAR_ALT) {
            return -1;  // a class, a negated class, any character, or a token
        }
        if (only >= 0 && only != (int64_t) e->value) {
            return -1;
        }
        only = e->value;
    }
    return only;
}

bool llama_opt_grammar_next_bytes(const llama_grammar & g, std::array<bool, 256> & bytes, bool & may_end) {
    if (g.partial_utf8.n_remain != 0) {
        return false;
    }
    for (const llama_grammar_stack & stack : g.stacks) {
        if (stack.empty()) {
            may_end = true;
            continue;
        }
        const llama_grammar_element * e = stack.back();
        if (e->type != LLAMA_GRETYPE_CHAR) {
            return false;
        }
        for (; e->type == LLAMA_GRETYPE_CHAR || e->type == LLAMA_GRETYPE_CHAR_ALT; ++e) {
            const uint32_t lo = e->value;
            const uint32_t hi = e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER ? e[1].value : lo;
            for (uint32_t c = lo; c <= hi && c < 0x80; ++c) {
                bytes[c] = true;
            }
            if (hi >= 0x80) {  // first bytes of multi-byte characters in the range
                const uint8_t from = (uint8_t) llama_opt_utf8(std::max<uint32_t>(lo, 0x80))[0];
                const uint8_t to   = (uint8_t) llama_opt_utf8(hi)[0];
                for (uint32_t b = from; b <= to; ++b) {
                    bytes[b] = true;
                }
            }
            if (e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
                ++e;
            }
        }
    }
    return true;
}
