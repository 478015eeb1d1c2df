"""Write-behind persistence (issue 42): with the disk tier on, the complete blocks of every prompt a
session computes are queued for a background writer as soon as its prefill ends (and the answer's
blocks once the next sync computes them on the canonical schedule), so they are on disk without the
session closing — a process killed with SIGKILL loses only what was still queued. The writer builds
each entry from the one on disk and the new rows, never rewrites what is stored, merges a session's
queued jobs, drops (and counts) a job over the queue's bound or whose base entry went, and never
makes a request wait. persist_write_behind=False keeps the old behaviour: written on save and close."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pyllamaopt import OptConfig, PersistStore
from test_persist import check_exact, llkv_files, persistent, restores, run_script
from test_reuse import ids, text_tokens

BLOCK = 64

KILLED_SCRIPT = """
    import sys, time
    import pyllamaopt
    from pyllamaopt import Context, OptConfig
    from test_reuse import text_tokens

    model = pyllamaopt.Model(sys.argv[1])
    ctx = Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2,
                  config=OptConfig(env={}, persist_enabled=True, persist_dir=sys.argv[2]))
    s = ctx.session()
    s.append(text_tokens(model, 700))
    print("prefilled", flush=True)
    time.sleep(600)  # killed here: the session never closes, the context never closes
"""


def test_a_prompt_is_on_disk_after_its_prefill_and_survives_a_kill(tiny_model, tiny_model_path, tmp_path):
    """A process computes a 700-token prompt and is killed with SIGKILL a second later, its session
    still open, nothing flushed: the prompt's 10 complete blocks were written behind (within the
    flush interval, 250 ms, and the write), and a new process restores them exactly."""
    proc = run_script(tmp_path, "killed.py", KILLED_SCRIPT, tiny_model_path, tmp_path / "kv")
    assert proc.stdout.readline().split() == ["prefilled"], proc.stderr.read() if proc.poll() is not None else ""
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert [e.n_tokens for e in PersistStore(tmp_path / "kv").entries()] == [640]
    assert PersistStore(tmp_path / "kv").verify() == {}
    stats = restores(tiny_model, tmp_path / "kv", text_tokens(tiny_model, 700))
    assert stats.persist_tokens_restored == 576 and stats.tokens_prefilled == 124


def test_each_prefill_queues_only_its_new_blocks(tiny_model, tmp_path):
    """Three appends: each queues the blocks it completed, written as an extension of the entry
    before it (which stays: the new entry holds only the new rows); the counts add up per session
    and per context."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        stored = []
        for start, stop in ((0, 150), (150, 420), (420, 700)):
            s.append(tokens[start:stop])
            assert ctx.flush_persist(timeout=60)
            stored.append(stop // BLOCK * BLOCK)  # an extension of the entry before it, which stays (format v2)
            assert sorted(e.n_tokens for e in ctx.persist.entries()) == stored
        st = s.stats
        assert st.persist_writes_queued == 3 and st.persist_saves == 3 and st.persist_errors == 0
        assert st.persist_writes_dropped == st.persist_writes_coalesced == 0
        sizes = [PersistStore(tmp_path).entries()[0].size]
        assert st.persist_bytes_written > sizes[0] and ctx.stats.persist_bytes_written == st.persist_bytes_written
        assert ctx.stats.persist_saves == 3
        s.close()  # nothing new to queue: the blocks are on disk
        assert ctx.flush_persist(timeout=60) and ctx.stats.persist_writes_queued == 3
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576


def test_the_answer_is_written_after_the_next_sync(tiny_model, tmp_path):
    """An answer's KV (decoded one token at a time) is not exact: it is written once the next
    turn's sync computed it again on the canonical schedule; a restore of the longer history is exact."""
    prompt = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(prompt)
        answer = ids(s.generate(100))
        assert ctx.flush_persist(timeout=60)
        assert [e.n_tokens for e in ctx.persist.entries()] == [640]  # the prompt's blocks only
        history = prompt + answer + text_tokens(tiny_model, 100, seed=3)
        s.sync(history)
        assert ctx.flush_persist(timeout=60)
        assert sorted(e.n_tokens for e in ctx.persist.entries()) == [640, len(history) // BLOCK * BLOCK]  # (extends it)
    stats = restores(tiny_model, tmp_path, history)
    assert stats.persist_tokens_restored == (len(history) - 64) // BLOCK * BLOCK


def test_a_full_queue_drops_writes_without_waiting_and_catches_up(tiny_model, tmp_path):
    """While the writer is held, prompts queue up to persist_queue_mb (1 MiB: one 2,500-token
    prompt of the tiny model fits, a second does not): the second is dropped and counted, its
    prefill goes on as before. Its session queues its blocks again at its next sync."""
    per_token = tiny_model.kv_bytes_per_token
    assert 2496 * per_token < 1 << 20 < 2 * 2496 * per_token
    prompts = [text_tokens(tiny_model, 2500, seed=seed) for seed in range(2)]
    with persistent(tiny_model, tmp_path, n_ctx=8192, persist_queue_mb=1) as ctx:
        ctx._core._hold_persist_writer(True)
        first, second = ctx.session(), ctx.session()
        first.append(prompts[0])
        second.append(prompts[1])
        assert first.stats.persist_writes_dropped == 0 and second.stats.persist_writes_dropped == 1
        assert ctx.stats.persist_writes_dropped == 1 and ctx.stats.persist_writes_queued == 2
        check_exact(second, tiny_model, prompts[1])
        ctx._core._hold_persist_writer(False)
        assert ctx.flush_persist(timeout=60)
        assert [e.n_tokens for e in ctx.persist.entries()] == [2496]
        second.sync(prompts[1] + text_tokens(tiny_model, 64, seed=9))  # its next turn: its blocks again
        assert ctx.flush_persist(timeout=60)
        assert sorted(e.n_tokens for e in ctx.persist.entries()) == [2496, 2560]
        assert second.stats.persist_saves == 1
    for prompt in prompts:
        assert restores(tiny_model, tmp_path, prompt, n_ctx=8192).persist_tokens_restored >= 2496 - 2 * BLOCK


def test_a_base_entry_removed_under_the_writer_is_written_again_whole(tiny_model, tmp_path):
    """The entry holding a session's first blocks goes (another process cleaned it) before its
    next blocks are written: that job is dropped (counted), the session learns what is on disk
    and its next job carries every block."""
    tokens = text_tokens(tiny_model, 900)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens[:300])
        assert ctx.flush_persist(timeout=60)
        [entry] = ctx.persist.entries()
        entry.path.unlink()
        s.append(tokens[300:700])
        assert ctx.flush_persist(timeout=60)
        assert s.stats.persist_writes_dropped == 1 and ctx.persist.entries() == []
        s.append(tokens[700:])
        assert ctx.flush_persist(timeout=60)
        assert [e.n_tokens for e in ctx.persist.entries()] == [896]
        assert s.stats.persist_saves == 2 and s.stats.persist_errors == 0
    assert PersistStore(tmp_path).verify() == {}
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 832


def test_what_is_stored_is_not_written_again(tiny_model, tmp_path):
    """A second process computing the same prompt restores it and writes nothing: the entry is
    only marked used (its mtime), the file is the same."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path) as ctx:
        ctx.session().append(tokens)
    [path] = llkv_files(tmp_path)
    inode = path.stat().st_ino
    os.utime(path, (1_000_000, 1_000_000))
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert ctx.flush_persist(timeout=60)
        assert s.stats.persist_tokens_restored == 576 and s.stats.persist_saves == 0
        s.close()
        assert ctx.flush_persist(timeout=60) and ctx.stats.persist_saves == 0
    assert llkv_files(tmp_path) == [path] and path.stat().st_ino == inode
    assert path.stat().st_mtime > 1_000_000


def test_the_pieces_of_a_prompt_are_written_once_within_the_flush_interval(tiny_model, tmp_path):
    """A prompt computed in pieces (as the server does while other requests wait): each piece's
    job waits persist_flush_ms for the next one, which merges into it; flush_persist does not wait."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path, persist_flush_ms=60_000) as ctx:
        s = ctx.session()
        for start in range(0, 700, 256):
            s.append(tokens[start:start + 256])
        time.sleep(0.2)
        assert llkv_files(tmp_path) == [] and ctx.stats.persist_writes_queued == 3
        assert ctx.flush_persist(timeout=60)
        assert ctx.stats.persist_saves == 1 and ctx.stats.persist_writes_coalesced == 2
        assert [e.n_tokens for e in ctx.persist.entries()] == [640]


def test_queued_jobs_of_a_session_are_coalesced(tiny_model, tmp_path):
    """Three turns queued while the writer is busy become one write of the longest history."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path) as ctx:
        ctx._core._hold_persist_writer(True)
        s = ctx.session()
        for start, stop in ((0, 150), (150, 420), (420, 700)):
            s.append(tokens[start:stop])
        assert not ctx.flush_persist(timeout=0.1)
        ctx._core._hold_persist_writer(False)
        assert ctx.flush_persist(timeout=60)
        st = s.stats
        assert st.persist_writes_queued == 3 and st.persist_writes_coalesced == 2 and st.persist_saves == 1
        assert [e.n_tokens for e in ctx.persist.entries()] == [640]
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576


def test_save_waits_for_the_sessions_queued_writes(tiny_model, tmp_path):
    """The explicit save stays synchronous and agrees with the writer: after the session's queued
    job is written, it finds its blocks stored and returns their count."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.save() == 640
        assert s.stats.persist_saves == 1 and s.stats.persist_writes_queued == 1
        assert [e.n_tokens for e in ctx.persist.entries()] == [640]


def test_a_fork_queues_only_the_blocks_it_adds(tiny_model, tmp_path):
    """A fork starts knowing what its parent queued: its first turn writes on top of the parent's entry."""
    tokens = text_tokens(tiny_model, 700)
    more = text_tokens(tiny_model, 200, seed=4)
    with persistent(tiny_model, tmp_path) as ctx:
        parent = ctx.session()
        parent.append(tokens)
        assert ctx.flush_persist(timeout=60)
        [base] = ctx.persist.entries()
        child = parent.fork()
        ctx._core._hold_persist_writer(True)
        child.append(more)
        base.path.unlink()  # its new blocks alone cannot make an entry now
        ctx._core._hold_persist_writer(False)
        assert ctx.flush_persist(timeout=60)
        assert child.stats.persist_writes_queued == 1 and child.stats.persist_writes_dropped == 1
        assert ctx.persist.entries() == []


def test_a_discarded_session_s_queued_blocks_are_not_written(tiny_model, tmp_path):
    """discard() (after an invariant violation its KV is not to be trusted): what it queued and
    the writer has not started is dropped, nothing of it reaches the disk."""
    with persistent(tiny_model, tmp_path) as ctx:
        ctx._core._hold_persist_writer(True)
        s = ctx.session()
        s.append(text_tokens(tiny_model, 700))
        s.discard()
        ctx._core._hold_persist_writer(False)
        assert ctx.flush_persist(timeout=60)
        assert ctx.stats.persist_writes_dropped == 1 and ctx.stats.persist_saves == 0
    assert llkv_files(tmp_path) == []


def test_write_behind_off_writes_on_close_only(tiny_model, tmp_path):
    """persist_write_behind=False: nothing is written while the session is open, as before."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path, persist_write_behind=False) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert ctx.flush_persist(timeout=0) and llkv_files(tmp_path) == []
        assert s.stats.persist_writes_queued == 0
        s.close()
        assert [e.n_tokens for e in ctx.persist.entries()] == [640] and ctx.stats.persist_saves == 1


def test_closing_the_context_flushes_the_queue(tiny_model, tmp_path):
    """Sessions still open when their context closes: close() waits for the writer to write what
    they queued (a server's drain), here while the writer is still held for half a second."""
    prompts = [text_tokens(tiny_model, 700, seed=seed) for seed in range(3)]
    ctx = persistent(tiny_model, tmp_path)
    ctx._core._hold_persist_writer(True)
    for prompt in prompts:
        ctx.session().append(prompt)
    threading.Timer(0.5, ctx._core._hold_persist_writer, (False,)).start()
    ctx.close()
    assert sorted(e.n_tokens for e in PersistStore(tmp_path).entries()) == [640, 640, 640]


@pytest.mark.parametrize("name, text, value", [("persist_write_behind", "0", False), ("persist_queue_mb", "64", 64),
                                               ("persist_flush_ms", "1000", 1000)])
def test_the_settings_come_from_the_environment(name, text, value):
    config = OptConfig(env={"LLAMA_OPT_" + name.upper(): text})
    assert getattr(config, name) == value and config.source(name) == "environment"
    assert OptConfig(env={}).persist_write_behind is True
