#pragma once

// session/room: where a session's KV goes in the cache. Aligned placement grows a
// sequence only into tiles above its highest one (llama_opt_kv_memory::make_room), so a history
// whose cells sit high may find no room to grow although the cache has room below: then it is
// computed again from the bottom (the same chunks: the same bits, docs/exactness.md, Relocation),
// before a prompt is computed, before an answer's first token, and when an answer meets the top.

#include "session/history.h"
#include "session/reuse.h"

class llama_opt_session_room {
public:
    llama_opt_session_room(llama_opt_session_history & history, llama_opt_session_reuse & reuse)
        : history_(history), reuse_(reuse) {}

    // Room for the history to grow to `end` tokens, else the history dropped to be computed from the
    // bottom (by the caller) with room for all of it; false: none even then.
    bool room_or_bottom(size_t end);
    // Before a turn's first token: room for up to `budget` output tokens above the history.
    void reserve_output_room(uint32_t budget);
    // Mid-answer (the answer began at `output_begin`, `budget` tokens at most), the history at the
    // cache's top: it and the answer so far computed again lower.
    void move_answer_down(size_t output_begin, uint32_t budget);

private:
    llama_opt_session_history & history_;
    llama_opt_session_reuse &   reuse_;
};
