#pragma once

// methods/grammar-chars: the characters llama.cpp's grammar (src/llama-grammar.h) allows
// next, read from its stacks without trying any token: what lets methods/grammar narrow the
// vocabulary before asking the grammar about tokens.

#include <array>
#include <cstdint>
#include <string>

struct llama_grammar;

// A code point as UTF-8.
std::string llama_opt_utf8(int64_t cpt);

// The one character every continuation starts with, or -1 when there are several (or the text
// may end here: end-of-generation is allowed then). Every character has a token (byte
// fallback), so several characters mean several allowed tokens.
int64_t llama_opt_grammar_only_next_char(const llama_grammar & grammar);

// The bytes some continuation starts with (set in `bytes`), and whether the text may end here;
// false when that is not known (inside a multi-byte character, or a negated class, any
// character, a token).
bool llama_opt_grammar_next_bytes(const llama_grammar & grammar, std::array<bool, 256> & bytes, bool & may_end);
