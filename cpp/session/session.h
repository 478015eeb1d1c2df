#pragma once

// session/session: one sequence of a context. An append-only token history (the tokens are
// the contract), the logits after its last token, and sampling. The public API: each call takes
// the context's lock and hands the work to the session's parts, which it owns and wires:
//
//   history      tokens, the account of their KV, logits, a memo draft's cells (the invariant)
//   reuse        the block pool, canonical sharing and the disk tier
//   room         where the KV goes: relocation before a prompt, before and during an answer
//   prefill      how new tokens get KV: canonical chunks, H2O, speculative prefill
//   sync         a new full token list: the common prefix kept, Tier-2 shifted spans
//   attn_prune   attention-sink pruning: cold blocks, scores
//   attn_drop    drop_span, sparse attention over marked tool results
//   decode       generation: sampling, memo drafts, batched steps
//
// (and counters, its statistics; approx settings, set_tier2's). Each part holds references to
// those it needs, in this order, none to a later one; the history tells attention pruning of a
// cut (follow_cuts), the only call upwards.

#include "session/attn-drop.h"
#include "session/decode.h"
#include "session/logprobs.h"
#include "base/config.h"
#include "base/numerics.h"
#include "base/stats.h"
#include "base/types.h"
#include "llama.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// One generation step: the new token and what the caller needs to know of it, in one call.
struct llama_opt_step {
    llama_token token = -1;     // -1: the grammar allows no token
    bool        eog   = false;  // an end-of-generation token
    std::string piece;          // its bytes (special tokens not rendered)
    size_t      room  = 0;      // tokens that still fit the context after it
    // with sampling.logprobs >= 0: its log-probability under the logits it was picked from, and the
    // most likely tokens there (session/logprobs)
    std::optional<llama_opt_token_logprob> logprob;
};

class llama_opt_session : public llama_opt_seq_owner {
public:
    static constexpr size_t npos = llama_opt_session_history::npos;

    // A new, empty session on a sequence of `ctx`. Throws llama_opt_error(context_overflow)
    // when every sequence is taken by an open session.
    static std::shared_ptr<llama_opt_session> open(std::shared_ptr<llama_opt_context> ctx);

    explicit llama_opt_session(std::shared_ptr<llama_opt_context> ctx);  // use open()
    ~llama_opt_session();

    llama_opt_session(const llama_opt_session &)             = delete;
    llama_opt_session & operator=(const llama_opt_session &) = delete;

    // Adds tokens to the history and computes their KV. On error (bad token, context
    // overflow, decode failure) the history is unchanged.
    void append(const std::vector<llama_token> & tokens);
    // append(), and then the Tier-2 methods that are on (session/attn-drop): sparse
    // attention drops the irrelevant spans of earlier tool results before a query is computed;
    // attention-sink pruning scores the turn's attention and prunes or restores blocks.
    void append(const std::vector<llama_token> & tokens, llama_opt_span_kind kind);

    // Tier 2: the KV of positions [p0, p1) leaves attention: its cells are freed, the positions of
    // the rest stay. The last evaluated token always keeps its KV. The session is approximate
    // from p0 on; its logits are computed again.
    void drop_span(size_t p0, size_t p1);
    // The Tier-2 settings of this session (attn_prune_*, sparse_*; the rest of `config` is not
    // read), instead of the context's. attn_prune_enabled needs a context made with it (its
    // queries are observed from then on): invalid_argument otherwise.
    void set_tier2(const llama_opt_config & config);
    // Positions without KV below n_evaluated() (dropped, or pruned to cold storage), as [begin, end).
    std::vector<std::pair<size_t, size_t>> holes() const;
    size_t n_cold() const;  // tokens pruned to cold storage (RAM) that can come back
    // The scores of the last append's queries over the session's keys (needs attn_prune_enabled).
    llama_opt_attn_probe attention_probe();

    // Sets the history to `tokens`: the KV of the common prefix with the current history is
    // kept (when diffing is on), blocks other sequences hold are shared (when dedup is on),
    // the rest is computed. On a bad token or an overflow the session is unchanged; if
    // computing fails, the history is cut back to the tokens whose KV exists.
    void sync(const std::vector<llama_token> & tokens);
    // Tier 2: sync(), with the tool results among `tokens` marked ([begin, end), sorted, disjoint)
    // as append(kind=tool) marks them. With sparse attention off (this session's settings) the
    // marks are ignored: a plain sync. On, the tokens after the kept prefix are appended in
    // pieces (cut back to the first new mark, a mark straddling the prefix appended whole), and
    // the new tool results (with any not yet scored) are scored once, against the text after
    // the last of them, before that text is computed (not against the text between two results).
    // Bad marks: invalid_argument, the session unchanged.
    void sync(const std::vector<llama_token> & tokens, const std::vector<std::pair<size_t, size_t>> & tool_spans);

    // Sets the history to `tokens`, computing every one afresh (nothing reused: session/prefill's
    // compute_afresh), and returns, for each token after the first, its log-probability given the
    // tokens before it and the `top_n` most likely tokens there (session/logprobs): the prompt's
    // own computation, bit for bit what a fresh context computes on the same schedule. On error
    // (a bad token, an overflow, top_n out of range) the history is empty.
    std::vector<llama_opt_token_logprob> score(const std::vector<llama_token> & tokens, int32_t top_n);

    // A new session with the same history, sharing this one's KV blocks.
    std::shared_ptr<llama_opt_session> fork();

    // kv-cache-persist: stores the KV of the history's complete canonical blocks on disk, unless
    // an entry holds them already; returns the tokens stored or already held. A failed write is
    // counted (persist_errors) and returns 0. Throws invalid_argument if persistence is off.
    // Synchronous: with write-behind, the session's queued jobs are written first (waiting). Sessions
    // are also saved (with write-behind: queued) when they close (and when their context closes), and
    // with write-behind each prompt's new blocks are queued as soon as they are computed.
    size_t save();

    // Sampler for the following next_token() calls.
    void set_sampling(const llama_opt_sampling & sampling);
    // Constrains the following next_token() calls to a GBNF grammar ("": none). Throws
    // llama_opt_error(grammar) if it does not parse. With schema_skip_enabled, a token the
    // grammar forces is taken without computing logits (methods/grammar). max_tokens: the
    // output's budget (0: none), which the grammar keeps to with schema_fit_max_tokens and memo
    // drafts stop at (rows past the output's last token would compute logits no one reads).
    // With `triggers` the grammar is lazy, as llama.cpp applies a chat format's tool-call grammar:
    // the output is free (the same tokens as without a grammar) until a trigger fires, then the
    // grammar takes the text from the trigger on and constrains the rest (methods/grammar-trigger).
    // Otherwise `prefill` is text the grammar takes first, as though generated (it is not added to
    // the history): a chat template's generation prompt, which llama.cpp's sampler feeds a chat
    // format's grammar (its root starts with that text); llama_opt_error(grammar) if it does not take it.
    void set_grammar(const std::string & gbnf, uint32_t max_tokens = 0,
                     const std::vector<llama_opt_grammar_trigger> & triggers = {},
                     const std::string & prefill = "");

    // Computes the KV of a pending (last sampled) token if any, then samples the next token
    // and adds it to the history as pending. Throws context_overflow when the history is full.
    // Returns -1 when a grammar allows no token.
    llama_token next_token();
    // next_token(), with what a streaming caller asks of each token.
    llama_opt_step step();

    // Batched decoding of several generations: computes, in batches of up to
    // LLAMA_OPT_ROW_INVARIANT_BATCH rows (each row computes like a one-token decode step,
    // patches/0006), the next step of every session whose next step is a decode step — its
    // pending token, and the memo's draft after it if there is one — so that their next step()
    // only samples. Tokens and logits are bit for bit those of stepping each session alone.
    // Sessions whose next step is something else (a grammar) are left to it, and so are all when
    // the KV cache has no room for the rows as it is (nothing is evicted for them). All sessions
    // must belong to one context.
    static void prefetch_steps(const std::vector<std::shared_ptr<llama_opt_session>> & sessions);

    // Ends a turn (a generation): drops its grammar, prints the turn's statistics when
    // LLAMA_OPT_STATS is on.
    void end_turn();

    // Closes the session. With dedup on, its complete blocks stay in the context for reuse
    // until the space is needed.
    void close();
    // Closes the session and drops its KV: nothing of it is saved or kept for reuse, and its
    // blocks still queued for the disk tier's writer are not written (after an invariant
    // violation, its KV is not to be trusted).
    void discard();
    bool closed() const;   // closed itself, evicted, or its context was closed
    bool evicted() const { return evicted_; }
    // Pinned: the context never evicts this session's KV for room, as during its generation (a
    // server pins a request's session from its prompt to its answer).
    bool pinned() const { return pinned_; }
    void set_pinned(bool pinned) { pinned_ = pinned; }

    std::vector<llama_token>         tokens() const;  // a copy, taken under the context's lock
    size_t                           n_evaluated() const { return history_.n_evaluated(); }
    size_t                           n_canonical() const { return history_.n_canonical(); }
    // Tier 2: KV of positions >= approx_from() was reused shifted after an edit; npos if none.
    size_t                           approx_from() const { return history_.approx_from(); }
    size_t                           room() const { return history_.room(); }  // tokens that still fit the context
    int32_t                          seq() const { return history_.seq(); }
    // The specification's INV-1 (003 §2.8), checked against the KV memory itself: the session's
    // account of its KV (positions [0, n_evaluated) computed, within the history) is what the
    // memory holds: its last position, and the first of each block. Empty if it holds (or the
    // session is closed), else what differs.
    std::string                      invariant_violation() const;
    // Logits after the last token of the history (computed if needed; empty if no history),
    // a copy. A pending sampled token is computed as the next generation step would.
    std::vector<float>               logits();
    llama_opt_stats                  stats() const;

private:
    void on_evicted() override;     // the context took our KV
    void on_kv_leaving() override;  // saves to the disk tier, never throws
    bool in_use() const override { return decode_.generating() || pinned_; }

    void check_open() const;

    std::shared_ptr<llama_opt_context> ctx_;
    bool                               closed_  = false;
    bool                               evicted_ = false;
    std::atomic<bool>                  pinned_{ false };  // set_pinned (read by evictions on any thread)
    llama_opt_session_counters         counters_;
    llama_opt_approx_settings          approx_;
    llama_opt_session_history          history_;
    llama_opt_session_reuse            reuse_;
    llama_opt_session_room             room_;
    llama_opt_session_prefill          prefill_;
    llama_opt_session_sync             sync_;
    llama_opt_session_attn_prune       attn_prune_;
    llama_opt_session_attn_drop        attn_drop_;
    llama_opt_session_decode           decode_;
};
