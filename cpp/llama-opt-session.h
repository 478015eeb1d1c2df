#pragma once

// llama-opt-session: one sequence of a context. An append-only token history (the tokens are
// the contract), the logits after its last token, and sampling.
//
// KV bookkeeping: tokens_[0, n_evaluated_) have KV in the cache; in canonical mode
// tokens_[0, n_canonical_) form complete blocks computed by the canonical schedule (or shared
// from a sequence that computed them so). The partial last block and generated tokens (decoded
// one at a time, a different kernel path) are recomputed before the history grows past them.

#include "llama-memo.h"
#include "llama-opt-attn.h"
#include "llama-opt-context.h"
#include "llama-opt-sampler.h"
#include "llama-opt.h"
#include "llama.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// What appended tokens are, for the Tier-2 methods that drop KV from attention: the system
// prompt is never pruned (attn_prune), tool results are scored against the next query and their
// irrelevant spans dropped (sparse_attn).
enum class llama_opt_span_kind { text, system, tool };

// Tier 2: what a turn's attention scores were (attention_probe), for tests against a reference.
struct llama_opt_attn_probe {
    llama_opt_attn_shape   shape;
    std::vector<int32_t>   layers;     // the scored layers
    std::vector<llama_pos> q_pos;      // positions of the queries
    std::vector<float>     q;          // layers × queries × n_head × head_dim (before the attention scale)
    std::vector<llama_pos> k_pos;      // positions with KV
    std::vector<float>     k;          // layers × keys × n_head_kv × head_dim
    std::vector<float>     scores;     // by key: mean over layers of the max over heads, mean over queries
};

// One generation step: the new token and what the caller needs to know of it, in one call.
struct llama_opt_step {
    llama_token token = -1;     // -1: the grammar allows no token
    bool        eog   = false;  // an end-of-generation token
    std::string piece;          // its bytes (special tokens not rendered)
    size_t      room  = 0;      // tokens that still fit the context after it
};

class llama_opt_session : public llama_opt_seq_owner {
public:
    static constexpr size_t npos = (size_t) -1;

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
    // append(), and then the Tier-2 methods that are on (llama-opt-session-tier2.cpp): sparse
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

    // A new session with the same history, sharing this one's KV blocks.
    std::shared_ptr<llama_opt_session> fork();

    // kv-cache-persist: stores the KV of the history's complete canonical blocks on disk, unless
    // an entry holds them already; returns the tokens stored or already held. A failed write is
    // counted (persist_errors) and returns 0. Throws invalid_argument if persistence is off.
    // Sessions are also saved when they close (and when their context closes).
    size_t save();

    // Sampler for the following next_token() calls.
    void set_sampling(const llama_opt_sampling & sampling);
    // Constrains the following next_token() calls to a GBNF grammar ("": none). Throws
    // llama_opt_error(grammar) if it does not parse. With schema_skip_enabled, a token the
    // grammar forces is taken without computing logits (llama-opt-grammar). max_tokens: the
    // output's budget (0: none), which the grammar keeps to with schema_fit_max_tokens and memo
    // drafts stop at (rows past the output's last token would compute logits no one reads).
    void set_grammar(const std::string & gbnf, uint32_t max_tokens = 0);

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
    // Closes the session and drops its KV: nothing of it is saved or kept for reuse (after an
    // invariant violation, its KV is not to be trusted).
    void discard();
    bool closed() const;   // closed itself, evicted, or its context was closed
    bool evicted() const { return evicted_; }
    // Pinned: the context never evicts this session's KV for room, as during its generation (a
    // server pins a request's session from its prompt to its answer).
    bool pinned() const { return pinned_; }
    void set_pinned(bool pinned) { pinned_ = pinned; }

    std::vector<llama_token>         tokens() const;  // a copy, taken under the context's lock
    size_t                           n_evaluated() const { return n_evaluated_; }
    size_t                           n_canonical() const { return n_canonical_; }
    // Tier 2: KV of positions >= approx_from() was reused shifted after an edit; npos if none.
    size_t                           approx_from() const { return approx_from_; }
    size_t                           room() const;  // tokens that still fit the context
    int32_t                          seq() const { return seq_; }
    // The specification's INV-1 (003 §2.8), checked against the KV memory itself: the session's
    // account of its KV (positions [0, n_evaluated) computed, within the history) is what the
    // memory holds: its last position, and the first of each block. Empty if it holds (or the
    // session is closed), else what differs.
    std::string                      invariant_violation() const;
    // Logits after the last token of the history (computed if needed; empty if no history),
    // a copy. A pending sampled token is computed as the next generation step would.
    std::vector<float>               logits();
    const llama_opt_stats &          stats() const { return stats_; }

private:
    void on_evicted() override;          // the context took our KV
    void on_kv_leaving() override;  // saves to the disk tier, never throws
    bool in_use() const override { return generating_ || pinned_; }

    void check_open() const;
    void count(uint64_t llama_opt_stats::* counter, uint64_t n);  // ours and the context's statistics
    void count_work(uint64_t llama_opt_stats::* counter, const llama_opt_work & work);
    // Computes tokens_[begin, end) (llama_opt_context::compute_span) with the logits of the last
    // token if `logits`, and counts the work.
    void compute(size_t begin, size_t end, uint64_t llama_opt_stats::* counter, bool evict_sessions, bool logits = true);
    // Tier 2: computes tokens_[p] for each of `positions` (llama_opt_context::compute_positions)
    // with the logits of the last, and counts the work.
    void compute_at(const std::vector<size_t> & positions, uint64_t llama_opt_stats::* counter, bool evict_sessions);
    // prefill(), and on failure cuts the history back to `keep` tokens (at most the tokens
    // whose KV exists) before rethrowing.
    void prefill_or_cut_back(size_t keep);
    void check_fits(size_t n_tokens) const;

    void prefill(uint64_t llama_opt_stats::* counter);  // computes tokens_[n_evaluated_, end)
    void reserve_output_room();  // before a turn's first token: room for its output above the history
    void move_answer_down();     // mid-answer, the history at the cache's top: it and the answer computed lower
    bool room_or_bottom(size_t end);  // room to grow to `end`, else the history dropped to compute from the bottom
    void ensure_logits(uint64_t llama_opt_stats::* counter);
    void decode_pending_step();            // pending generated tokens, as one-token decodes
    llama_opt_memo_draft find_draft() const;  // memo: a draft for the next step (none if memo is off)
    bool check_draft();                    // memo: the pending step and a draft in one batch; false: no draft
    // prefetch_steps: the rows of the next step if it is a decode step (the pending token, then
    // the memo's draft if there is one), appended to `rows`; false if the step is something else
    bool step_rows(std::vector<llama_opt_row> & rows, llama_opt_memo_draft & draft) const;
    // prefetch_steps: that step computed in a shared batch: its rows' logits, its share of the time
    void take_rows(const float * logits, llama_opt_memo_draft draft, uint64_t us);
    void take_checked(llama_token token);  // memo: a token joined the history: confirm it as drafted, or drop the draft
    void drop_draft();                     // memo: frees the KV of drafted tokens not confirmed
    void publish_output();                 // memo: the turn's output joins the context's recent outputs (memo_shared)
    llama_token take_inferred(llama_token token);  // a token the grammar decided
    void forget(size_t pos);               // drops the KV of positions >= pos
    void adopt_shared_prefix();            // dedup: take a longer canonical prefix another sequence holds
    void register_blocks();                // dedup: put new complete blocks into the pool
    void share_duplicate(size_t k, const llama_opt_kv_block * b);  // canon: store block k once
    // Tier 2 sync: the KV of positions [from, from + n) is reused at [to, to + n)
    struct span_move { size_t from, to, n; };
    std::vector<span_move> plan_shifted(const std::vector<llama_token> & tokens, size_t keep) const;
    static std::vector<span_move> parking_order(std::vector<span_move> moves);
    // false, with nothing computed and the reason counted, if the plan cannot work (then sync does
    // exact mode's work)
    bool sync_shifted(const std::vector<llama_token> & tokens, size_t keep, const std::vector<span_move> & moves);
    size_t save_blocks();                  // save() without the checks
    void   save_quietly();                 // on close: never throws, failures are counted
    void   restore_from_disk(size_t end);  // persist: take a longer canonical prefix from disk
    std::vector<uint64_t> persist_chain(size_t n_blocks) const;  // unmasked chained hashes
    bool approximate() const { return approx_from_ != npos; }
    // Tier 2 (llama-opt-session-tier2.cpp)
    const llama_opt_config & tier2() const;       // set_tier2's, or the context's
    void copy_tier2_to(llama_opt_session & fork) const;  // what a fork keeps: settings, tool spans, system end
    void drop_cells(size_t p0, size_t p1);         // a hole; approximate from p0
    void forget_holes(size_t pos);                 // the history is cut at pos
    bool in_hole(size_t pos) const;
    void drop_irrelevant_tool_spans(const std::vector<llama_token> & query);  // sparse_attn
    // H2O (docs/h2o.md): a prompt of more than h2o_chunk_size tokens into a session without KV
    bool uses_h2o(size_t end) const;
    void compute_h2o(size_t end);                  // tokens_[0, end) by H2O chunks, counted
    // append(tokens, kind); with score_tools false a text append leaves the tool results not yet
    // scored for a later one (the text between two tool results of one sync)
    void append_marked(const std::vector<llama_token> & tokens, llama_opt_span_kind kind, bool score_tools);
    void prune_turn(size_t turn_begin);            // attn_prune, after a turn's tokens are computed
    // spec_prefill: computes only the tokens of [n_evaluated_, end) its scorer keeps (the rest are
    // holes); false, with nothing computed, when the prompt is computed whole (off, too short,
    // everything kept, or no scores)
    bool spec_prefill(size_t end, uint64_t llama_opt_stats::* counter);
    bool restore_block(size_t block);              // attn_prune: a cold block back into the KV
    std::vector<std::pair<size_t, size_t>> live_ranges() const;  // [0, n_evaluated_) less the holes

    std::shared_ptr<llama_opt_context> ctx_;
    int32_t                            seq_ = -1;
    bool                               closed_      = false;
    bool                               evicted_     = false;
    std::vector<llama_token>           tokens_;           // history
    size_t                             n_evaluated_ = 0;  // tokens_[0, n_evaluated_) have KV
    size_t                             n_canonical_ = 0;  // tokens with canonical (reusable) KV
    size_t                             approx_from_ = npos;  // see approx_from()
    std::vector<uint64_t>              chain_;            // chained hashes of the canonical blocks
                                                          // (the context holds their pool ids: held_blocks)
    std::vector<float>                 logits_;
    size_t                             logits_for_  = 0;  // logits_ follow token logits_for_ - 1
    llama_opt_sampler                  sampler_;
    llama_opt_memo_check               memo_;             // a draft being checked: its cells lie beyond n_evaluated_
    bool                               generating_ = false;  // a turn's generation is on: drafts pay off only then
    std::atomic<bool>                  pinned_{ false };     // set_pinned (read by evictions on any thread)
    size_t                             output_begin_ = 0;     // where the turn's generated tokens begin in tokens_
    uint32_t                           output_budget_ = 0;    // set_grammar's max_tokens: the most this turn generates
    llama_opt_stats                    stats_;
    llama_opt_stats                    turn_start_;
    // Tier 2: positions without KV (sorted, disjoint), the KV rows of pruned blocks (by block),
    // the pruner's statistics, the end of the system prompt, tool results not yet scored
    std::unique_ptr<llama_opt_config>        tier2_;  // null: the context's
    std::vector<std::pair<size_t, size_t>>   holes_;
    std::map<size_t, std::vector<uint8_t>>   cold_;
    llama_opt_attn_pruner                    pruner_{ 0.001f, 10 };
    size_t                                   system_end_ = 0;
    std::vector<std::pair<size_t, size_t>>   tool_spans_;
};
