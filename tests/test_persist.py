"""The persistent KV cache on disk (kv-cache-persist) on the tiny model: a session's complete
blocks are saved to a directory and read back, instead of computed, by a later context or
process whose prompt starts with them.

Promised in every case, good or bad (the issue's words): no crash, no wrong tokens (a restored
session gives the same logits, bit for bit, and the same greedy output as a fresh prefill), a bad
entry is counted and ignored or removed, the session goes on. Tested here: exact restores (whole
histories, prefixes, after an automatic save, from another process, with other context sizes),
entries of another model or build, the file format (docs/persist-format.md), truncated or
corrupted files, foreign files, an unwritable directory, a full disk, a process killed while
saving, two processes sharing a directory, the size budget and clean()."""
from __future__ import annotations

import math
import os
import random
import re
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pyllamaopt import ConfigError, Context, InvalidArgumentError, Model, ModelLoadError, OptConfig, PersistStore
from test_reuse import context, ids, reference, text_tokens
from test_shifted_reuse import edited_histories
from tinymodel import write_tiny_llama

TESTS = Path(__file__).resolve().parent
BLOCK = 64
HEADER = 128
MAGIC = b"LLAMAKV\0"


# The tests below that pin *when* entries are written (on save and close only: no entry while a
# session is open, one failed write per save, a broken entry left for clean()) run with the
# background writer off; write-behind (on by default) is tested in test_persist_write_behind.py.
WRITTEN_ON_SAVE = {"persist_write_behind": False}


def persistent(model, directory, n_ctx=4096, **config):
    """A context with the persistent KV cache in `directory`."""
    return Context(model, n_ctx=n_ctx, n_batch=256, n_seq_max=8, n_threads=2,
                   config=OptConfig(env={}, persist_enabled=True, persist_dir=str(directory), **config))


def llkv_files(directory):
    return sorted(p for p in Path(directory).glob("*.llkv"))


def tmp_files(directory):
    return sorted(p.name for p in Path(directory).iterdir() if p.name.startswith(".tmp-"))


def save_history(model, directory, tokens, **config):
    """Saves the KV of `tokens` in a context of its own; returns the new entry's path."""
    before = set(llkv_files(directory)) if Path(directory).is_dir() else set()
    with persistent(model, directory, **config) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.save() == len(tokens) // BLOCK * BLOCK
        assert s.stats.persist_saves == 1 and s.stats.persist_errors == 0
    new = set(llkv_files(directory)) - before
    assert len(new) == 1, f"expected one new entry, got {sorted(new)}"
    return new.pop()


def header_u64(path, offset):
    with open(path, "rb") as f:
        f.seek(offset)
        return struct.unpack("<Q", f.read(8))[0]


def flip_bit(path, offset, bit=4):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


M64 = (1 << 64) - 1
P1, P2 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F


def checksum(data, seed=0):
    """llama_opt_checksum, the format's 64-bit checksum, in Python."""
    def mix(h, w):
        h ^= w * P1 & M64
        return ((h << 31 | h >> 33) & M64) * P2 & M64

    n = len(data) // 8 * 8
    h = seed ^ (P2 * (len(data) + 1) & M64)
    for (w,) in struct.iter_unpack("<Q", data[:n]):
        h = mix(h, w)
    h = mix(h, int.from_bytes(data[n:], "little"))
    h ^= h >> 33
    h = h * P1 & M64
    return h ^ h >> 29


def parse_entry(path):
    """The header fields of an entry, its metadata sections and its data (docs/persist-format.md)."""
    raw = path.read_bytes()
    (n_tokens, block_size) = struct.unpack_from("<II", raw, 40)
    (tokens_offset, chain_offset, checksums_offset, data_offset, file_size, meta) = struct.unpack_from("<6Q", raw, 80)
    n_blocks = n_tokens // block_size
    return dict(raw=raw, n_tokens=n_tokens, block_size=block_size, n_blocks=n_blocks, tokens_offset=tokens_offset,
                chain_offset=chain_offset, checksums_offset=checksums_offset, data_offset=data_offset,
                file_size=file_size, meta_checksum=meta)


def meta_checksum(raw, n_tokens, n_blocks):
    header = raw[:120] + bytes(8)
    c = checksum(header)
    c = checksum(raw[HEADER:HEADER + 4 * n_tokens], c)
    c = checksum(raw[HEADER + 4 * n_tokens:HEADER + 4 * n_tokens + 8 * n_blocks], c)
    return checksum(raw[HEADER + 4 * n_tokens + 8 * n_blocks:HEADER + 4 * n_tokens + 16 * n_blocks], c)


def check_exact(session, model, tokens, n_generate=10):
    """The session's logits equal a from-scratch prefill of `tokens`, bit for bit, and so does
    its greedy continuation."""
    expected_logits, expected_tokens = reference(model, tokens, n_generate)
    np.testing.assert_array_equal(session.logits(), expected_logits)
    assert ids(session.generate(n_generate)) == expected_tokens


def restores(model, directory, tokens, n_generate=10, **config):
    """Appends `tokens` to a session of a fresh context, checks it is exact, returns its stats."""
    with persistent(model, directory, **config) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        check_exact(s, model, tokens, n_generate)
        return stats


def run_script(tmp_path, name, source, *args, timeout=120):
    """Starts `source` as a Python script in a new process, which can import the test helpers.
    It is killed after `timeout` seconds, so that a hung child cannot hang the tests."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    # no empty entry on the path: it would mean the current directory, and from the checkout the
    # source tree's pyllamaopt/ (without the built _core) would shadow the installed package
    path = [str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env, text=True, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    return proc


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """A tiny model of the same shape and vocabulary, with other weights."""
    return Model(write_tiny_llama(tmp_path_factory.mktemp("other") / "tiny-llama-seed1.gguf", seed=1))


# --- exact restores -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["append", "sync", "pieces"])
def test_restore_in_a_new_context_is_exact(tiny_model, tmp_path, how):
    """A 700-token history saved by one context is read back by a new one (its 64-token blocks,
    up to the last chunk, which is always computed): far less prefill, identical logits and
    greedy output, whether the new history comes in one append, a sync or several appends."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path / "kv") as ctx:
        assert isinstance(ctx.persist, PersistStore)
        assert ctx.persist.directory == tmp_path / "kv"
        s = ctx.session()
        s.append(tokens)
        first = s.stats
        assert first.persist_misses == 1 and first.persist_tokens_restored == 0
        assert first.tokens_prefilled == 700
        assert s.save() == 640  # 10 complete blocks
        assert s.save() == 640  # stored already: not written again
        assert s.stats.persist_saves == 1
        [entry] = ctx.persist.entries()
        assert entry.n_tokens == 640 and entry.problem == "" and entry.path.name.endswith(".llkv")
        assert entry.model_hash != 0 and entry.size > 640 * tiny_model.kv_bytes_per_token
        assert 0 <= entry.age < 60
    assert PersistStore(tmp_path / "kv").verify() == {}

    with persistent(tiny_model, tmp_path / "kv") as ctx:
        s = ctx.session()
        if how == "append":
            s.append(tokens)
        elif how == "sync":
            s.sync(tokens)
        else:
            for start, stop in ((0, 150), (150, 420), (420, 700)):
                s.append(tokens[start:stop])
        stats = s.stats
        assert stats.persist_misses == stats.persist_misses_corrupt == stats.persist_misses_incompatible == 0
        if how == "pieces":  # each piece restores up to its own last chunk, which it computes
            assert stats.persist_loads == 3
            assert stats.persist_tokens_restored == 64 + 192 + 192
            assert stats.tokens_prefilled < 700 - 384
        else:
            assert stats.persist_loads == 1
            assert stats.persist_tokens_restored == 576  # 9 blocks: the last 64+ tokens are computed
            assert stats.tokens_prefilled == 700 - 576
        assert ctx.stats.persist_tokens_restored == stats.persist_tokens_restored
        check_exact(s, tiny_model, tokens, 12)


def test_persistence_is_off_by_default(tiny_model):
    with context(tiny_model) as ctx:
        assert ctx.persist is None
        s = ctx.session()
        s.append(text_tokens(tiny_model, 200))
        with pytest.raises(InvalidArgumentError):
            s.save()
        assert s.stats.persist_misses == 0


@pytest.mark.parametrize("shared, extra, restored", [(500, 200, 448), (700, 300, 640), (130, 600, 128)])
def test_a_prompt_sharing_a_prefix_restores_its_complete_blocks(tiny_model, tmp_path, shared, extra, restored):
    """A stored 700-token context (10 blocks) restores the block-aligned part of the prefix a new
    prompt shares with it (500 shared tokens: 7 blocks; all of it plus more: 10 blocks), exactly."""
    stored = text_tokens(tiny_model, 700)
    save_history(tiny_model, tmp_path, stored)
    prompt = stored[:shared] + text_tokens(tiny_model, extra, seed=42)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(prompt)
        stats = s.stats
        assert stats.persist_tokens_restored == restored
        assert stats.tokens_prefilled == len(prompt) - restored
        check_exact(s, tiny_model, prompt)


def test_restore_after_blocks_taken_from_another_session(tiny_model, tmp_path):
    """The RAM tier first (blocks shared with a live session of the context), then the disk for
    the blocks after them; exact either way."""
    tokens = text_tokens(tiny_model, 900)
    save_history(tiny_model, tmp_path, tokens[:700])
    with persistent(tiny_model, tmp_path) as ctx:
        a = ctx.session()
        a.append(tokens[:300])
        b = ctx.session()
        b.append(tokens)
        assert b.stats.dedup_tokens_saved > 0
        assert b.stats.persist_tokens_restored > 0
        assert b.stats.dedup_tokens_saved + b.stats.persist_tokens_restored == 640
        check_exact(b, tiny_model, tokens)
        check_exact(a, tiny_model, tokens[:300])
    # b, saved when the context closed, holds blocks it shared: they restore exactly too
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 832


def test_an_entry_restores_exactly_in_a_context_with_other_sizes_and_threads(tiny_model, tmp_path):
    """Batch size, thread count and n_ctx do not change the KV bits (the canonical schedule):
    an entry saved with n_batch=64, 1 thread, n_ctx=1024 restores exactly elsewhere."""
    tokens = text_tokens(tiny_model, 700)
    with Context(tiny_model, n_ctx=1024, n_batch=64, n_seq_max=2, n_threads=1,
                 config=OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path))) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.save() == 640
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576
    with Context(tiny_model, n_ctx=2048, n_batch=512, n_seq_max=2, n_threads=1,
                 config=OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path))) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_tokens_restored == 576
        check_exact(s, tiny_model, tokens)


def test_restore_into_a_context_short_of_room(tiny_model, tmp_path):
    """n_ctx=1024: restoring 576 tokens beside a live session, or after evicting a closed
    (cached) one to make room; every session stays exact."""
    mine, other = text_tokens(tiny_model, 700, seed=2), text_tokens(tiny_model, 700, seed=1)
    save_history(tiny_model, tmp_path, mine)
    with persistent(tiny_model, tmp_path, n_ctx=1024) as ctx:
        live = ctx.session()
        live.append(other[:300])
        s = ctx.session()
        s.append(mine)
        assert s.stats.persist_tokens_restored == 576
        # (no generation here: it would fill the cache and evict the idle session, as without persistence)
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, mine)[0])
        np.testing.assert_array_equal(live.logits(), reference(tiny_model, other[:300])[0])
    with persistent(tiny_model, tmp_path, n_ctx=1024) as ctx:
        cached = ctx.session()
        cached.append(other)
        cached.close()
        s = ctx.session()
        s.append(mine)
        assert s.stats.persist_tokens_restored == 576
        assert ctx.stats.dedup_sequences_evicted == 1
        check_exact(s, tiny_model, mine)


def test_a_restore_evicts_an_idle_session_for_room_as_computing_would(tiny_model, tmp_path):
    """n_ctx=1024 held by an idle open session of 700 tokens: a prompt whose blocks are on disk
    evicts it to restore them (before, the restore gave up and the whole prompt was computed,
    evicting it anyway); the session evicted is saved, as computing's evictions save it."""
    mine, other = text_tokens(tiny_model, 700, seed=2), text_tokens(tiny_model, 700, seed=1)
    save_history(tiny_model, tmp_path, mine)
    with persistent(tiny_model, tmp_path, n_ctx=1024) as ctx:
        idle = ctx.session()
        idle.append(other)
        s = ctx.session()
        s.append(mine)
        assert s.stats.persist_tokens_restored == 576 and s.stats.tokens_prefilled == 124
        assert idle.closed and ctx.stats.sessions_evicted == 1
        check_exact(s, tiny_model, mine)
    assert restores(tiny_model, tmp_path, other).persist_tokens_restored == 576


def test_sessions_are_saved_when_they_close_and_when_the_context_closes(tiny_model, tmp_path):
    """No explicit save(): closing a session stores it, closing the context stores its open
    sessions; a new context restores both exactly."""
    first, second = text_tokens(tiny_model, 700, seed=1), text_tokens(tiny_model, 600, seed=2)
    ctx = persistent(tiny_model, tmp_path, **WRITTEN_ON_SAVE)
    a, b = ctx.session(), ctx.session()
    a.append(first)
    b.append(second)
    assert llkv_files(tmp_path) == []
    a.close()
    assert [e.n_tokens for e in PersistStore(tmp_path).entries()] == [640]
    assert ctx.stats.persist_saves == 1
    ctx.close()
    assert sorted(e.n_tokens for e in PersistStore(tmp_path).entries()) == [576, 640]
    assert PersistStore(tmp_path).verify() == {}
    assert restores(tiny_model, tmp_path, first).persist_tokens_restored == 576
    assert restores(tiny_model, tmp_path, second).persist_tokens_restored == 512


def test_a_longer_save_replaces_the_entry_of_its_prefix(tiny_model, tmp_path):
    """An entry whose tokens are a prefix of a newly saved context is removed (the new one
    restores that prefix too); the context after a turn restores exactly. (Written on save: the
    writer behind keeps the prefix's entry, which its entry extends: test_persist_extensions.)"""
    prompt = text_tokens(tiny_model, 400)
    with persistent(tiny_model, tmp_path, **WRITTEN_ON_SAVE) as ctx:
        s = ctx.session()
        s.append(prompt)
        assert s.save() == 384
        answer = ids(s.generate(20))
        s.append(text_tokens(tiny_model, 300, seed=3))
        assert s.save() == (420 + 300) // BLOCK * BLOCK
        history = s.tokens
        assert [e.n_tokens for e in ctx.persist.entries()] == [704]
    assert history[:420] == prompt + answer
    assert restores(tiny_model, tmp_path, history).persist_tokens_restored == 640
    assert restores(tiny_model, tmp_path, prompt).persist_tokens_restored == 320


def test_only_exact_kv_is_saved(tiny_model, tmp_path):
    """Tier 2 (diff_reuse_shifted) makes the KV after an edit approximate: only the exact blocks
    before it are saved, so a restore stays exact."""
    a, b = edited_histories(tiny_model)  # b: 37 tokens inserted at 200
    with persistent(tiny_model, tmp_path, diff_reuse_shifted=True, **WRITTEN_ON_SAVE) as ctx:
        s = ctx.session()
        s.sync(a)
        s.sync(b)
        assert s.approx_from == 200 and s.stats.diff_tokens_shifted > 0
        assert s.save() == 192
    assert [e.n_tokens for e in PersistStore(tmp_path).entries()] == [192]
    assert restores(tiny_model, tmp_path, b).persist_tokens_restored == 192


def test_a_history_shorter_than_a_block_stores_nothing(tiny_model, tmp_path):
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(text_tokens(tiny_model, 60))
        assert s.save() == 0
        assert s.stats.persist_saves == 0 and s.stats.persist_errors == 0
    assert llkv_files(tmp_path) == []


def test_persistence_needs_flash_attention(tiny_model, tmp_path):
    """Without flash attention llama.cpp stores V transposed: no row layout to store, an error."""
    with pytest.raises(ConfigError, match="flash_attn"):
        Context(tiny_model, n_ctx=1024, flash_attn=False,
                config=OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path)))


SAVE_SCRIPT = """
    import sys
    import pyllamaopt
    from pyllamaopt import Context, OptConfig
    from test_reuse import text_tokens

    model = pyllamaopt.Model(sys.argv[1])
    with Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2,
                 config=OptConfig(env={}, persist_enabled=True, persist_dir=sys.argv[2])) as ctx:
        s = ctx.session()
        s.append(text_tokens(model, 700))
        print("saved", s.save(), s.stats.persist_saves, flush=True)
"""


def test_restore_after_a_restart_in_another_process(tiny_model, tiny_model_path, tmp_path):
    """Another process saves; this one (another model instance, another context) restores exactly."""
    proc = run_script(tmp_path, "save.py", SAVE_SCRIPT, tiny_model_path, tmp_path / "kv")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["saved", "640", "1"]
    stats = restores(tiny_model, tmp_path / "kv", text_tokens(tiny_model, 700))
    assert stats.persist_tokens_restored == 576
    assert stats.tokens_prefilled == 124


# --- what is stored must match --------------------------------------------------------------


def test_entries_of_another_model_are_never_used(tiny_model, other_model, tmp_path):
    """Same vocabulary, same tokens, other weights: a miss counted as incompatible, the output is
    the other model's own; the two models' entries live side by side."""
    tokens = text_tokens(tiny_model, 700)
    assert text_tokens(other_model, 700) == tokens
    mine = save_history(tiny_model, tmp_path, tokens)
    with persistent(other_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        assert stats.persist_misses_incompatible == 1
        assert stats.persist_tokens_restored == 0 and stats.persist_loads == 0
        assert stats.tokens_prefilled == 700
        check_exact(s, other_model, tokens)
        assert s.save() > 0
    entries = PersistStore(tmp_path).entries()
    assert len(entries) == 2 and mine in {e.path for e in entries}
    assert len({e.model_hash for e in entries}) == 2
    assert PersistStore(tmp_path).verify() == {}
    # each model restores its own entry
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576
    assert restores(other_model, tmp_path, tokens).persist_tokens_restored == 576


def test_a_model_file_rewritten_in_place_is_another_model(tmp_path):
    """The model's identity is its content, not its path: the same file overwritten with other
    weights (same size, same inode) restores nothing of the old model's entries."""
    path = write_tiny_llama(tmp_path / "model.gguf", seed=0)
    first = Model(path)
    tokens = text_tokens(first, 700)
    save_history(first, tmp_path / "kv", tokens)
    other = write_tiny_llama(tmp_path / "other.gguf", seed=1).read_bytes()
    assert len(other) == path.stat().st_size
    with open(path, "r+b") as f:
        f.write(other)
    second = Model(path)
    with persistent(second, tmp_path / "kv") as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_tokens_restored == 0
        assert s.stats.persist_misses_incompatible == 1
        check_exact(s, second, tokens)


def test_a_model_file_replaced_after_the_model_loaded_is_refused(tmp_path):
    """The KV cache names entries by the model file's content, read when the context is made: a file
    replaced (or written) after the Model loaded it is not the weights in memory, and would have
    named their KV as another model's. Refused with what to do; without persistence the model works."""
    path = write_tiny_llama(tmp_path / "model.gguf", seed=0)
    loaded = Model(path)
    tokens = text_tokens(loaded, 700)
    write_tiny_llama(tmp_path / "update.gguf", seed=1).replace(path)  # an update lands
    with pytest.raises(ModelLoadError, match="no longer the file the model was loaded from"):
        persistent(loaded, tmp_path / "kv")
    assert not list((tmp_path / "kv").glob("*.llkv"))
    with Context(loaded, n_ctx=1024, n_threads=2, config=OptConfig(env={})) as ctx:
        s = ctx.session()
        s.append(tokens)
        check_exact(s, loaded, tokens)
    reloaded = Model(path)
    save_history(reloaded, tmp_path / "kv", tokens)
    assert restores(reloaded, tmp_path / "kv", tokens).persist_tokens_restored == 576


def test_another_block_size_does_not_restore(tiny_model, tmp_path):
    """Entries saved with another block size are not used (other blocks, other layout)."""
    tokens = text_tokens(tiny_model, 700)
    save_history(tiny_model, tmp_path, tokens)
    with persistent(tiny_model, tmp_path, block_size=128) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_tokens_restored == 0 and s.stats.persist_loads == 0
        assert s.stats.persist_misses == 1
        expected_logits, expected_tokens = reference(tiny_model, tokens, 8)
        np.testing.assert_array_equal(s.logits(), expected_logits)
        assert ids(s.generate(8)) == expected_tokens


def test_the_file_format(tiny_model, tmp_path):
    """What docs/persist-format.md says: the header, the stored tokens, the chained hashes, the
    checksums of the metadata and of every block, the 4096-aligned data (checked in Python)."""
    tokens = text_tokens(tiny_model, 700)
    path = save_history(tiny_model, tmp_path, tokens)
    assert re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{16}\.llkv", path.name)
    e = parse_entry(path)
    raw = e["raw"]
    assert raw[:8] == MAGIC and struct.unpack_from("<II", raw, 8) == (1, HEADER)
    assert e["n_tokens"] == 640 and e["block_size"] == BLOCK
    assert struct.unpack_from("<Q", raw, 72)[0] == tiny_model.kv_bytes_per_token
    assert struct.unpack_from("<ii", raw, 64) == (1, 1)  # K and V in F16
    assert e["tokens_offset"] == HEADER and e["chain_offset"] == HEADER + 4 * 640
    assert e["checksums_offset"] == e["chain_offset"] + 8 * 10
    assert e["data_offset"] % 4096 == 0 and e["data_offset"] >= e["checksums_offset"] + 8 * 10
    block_bytes = BLOCK * tiny_model.kv_bytes_per_token
    assert e["file_size"] == len(raw) == e["data_offset"] + 10 * block_bytes
    assert list(struct.unpack_from("<640i", raw, HEADER)) == tokens[:640]
    chain = struct.unpack_from("<10Q", raw, e["chain_offset"])
    assert struct.unpack_from("<Q", raw, 32)[0] == chain[-1]  # the context hash: the last block's
    assert path.name.startswith(f"{chain[-1]:016x}-")
    assert e["meta_checksum"] == meta_checksum(raw, 640, 10)
    sums = struct.unpack_from("<10Q", raw, e["checksums_offset"])
    for k in range(10):
        block = raw[e["data_offset"] + k * block_bytes:e["data_offset"] + (k + 1) * block_bytes]
        assert checksum(block) == sums[k]


def as_written_by_another_build(path: Path, field: str = "compat_hash", offset: int = 24) -> Path:
    """The 640-token entry at `path` as another build (or one for another model, or another KV type)
    would have written it: that header field changed, its checksums valid, under that build's name."""
    raw = bytearray(parse_entry(path)["raw"])
    struct.pack_into("<Q" if field.endswith("hash") else "<i", raw, offset,
                     struct.unpack_from("<Q" if field.endswith("hash") else "<i", raw, offset)[0] ^ 0x5A5)
    struct.pack_into("<Q", raw, 120, meta_checksum(bytes(raw), 640, 10))
    path.unlink()
    context_hash, key = path.stem.split("-")
    path = path.with_name(f"{context_hash}-{int(key, 16) ^ 0x5A5:016x}.llkv")  # that build's name for it
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("field, offset", [("compat_hash", 24), ("model_hash", 16), ("k_type", 64)])
def test_a_sound_entry_of_another_build_is_never_used(tiny_model, tmp_path, field, offset):
    """An entry written by another build (or for another model, or another KV type): sound, with
    valid checksums (rewritten here), but a miss counted as incompatible; clean() keeps it."""
    tokens = text_tokens(tiny_model, 700)
    path = as_written_by_another_build(save_history(tiny_model, tmp_path, tokens), field, offset)
    store = PersistStore(tmp_path)
    assert store.verify() == {} and store.entries()[0].problem == ""
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        assert stats.persist_misses_incompatible == 1 and stats.persist_misses == 0
        assert stats.persist_tokens_restored == 0 and stats.tokens_prefilled == 700
        check_exact(s, tiny_model, tokens)
        assert store.clean() == 0 and path.exists()
    assert len(store.entries()) == 2  # ours was saved when the context closed, beside it
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576


# --- damaged entries ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 7, 100, 3000, "half", "minus1", "plus100"])
def test_a_truncated_entry_is_a_miss_and_clean_removes_it(tiny_model, tmp_path, size):
    """A file cut short (or grown) anywhere: verify() reports it, a lookup skips it (a plain miss),
    the output is exact, clean() removes it."""
    tokens = text_tokens(tiny_model, 700)
    path = save_history(tiny_model, tmp_path, tokens)
    full = path.stat().st_size
    if size == "plus100":
        with open(path, "ab") as f:
            f.write(os.urandom(100))
    else:
        os.truncate(path, {"half": full // 2, "minus1": full - 1}.get(size, size))
    store = PersistStore(tmp_path)
    assert list(store.verify()) == [path]
    [entry] = store.entries()
    assert entry.problem
    assert_skipped_then_cleaned(tiny_model, tmp_path, tokens, store, path)
    # the session was saved again when the context closed: a sound entry
    assert store.verify() == {} and len(store.entries()) == 1
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576


def assert_skipped_then_cleaned(model, tmp_path, tokens, store, path):
    """A broken entry is a plain miss (the output exact), and clean() removes it."""
    with persistent(model, tmp_path, **WRITTEN_ON_SAVE) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        assert stats.persist_tokens_restored == 0 and stats.persist_loads == 0
        assert stats.persist_misses == 1
        check_exact(s, model, tokens)
        assert store.clean() == 1
        assert not path.exists()


# header offsets: magic, version, model hash, n_tokens, block_size, bytes_per_token, data_offset,
# file_size, meta checksum; then in the stored tokens, the chain hashes and the block checksums
HEADER_FLIPS = [0, 8, 16, 40, 44, 72, 104, 112, 120, HEADER + 40, HEADER + 1400, 2700, 2770]


@pytest.mark.parametrize("offset", HEADER_FLIPS)
def test_a_flipped_bit_in_the_header_is_a_miss_and_clean_removes_it(tiny_model, tmp_path, offset):
    """A bad header or metadata table (magic, version, sizes, offsets, hashes, checksums): the
    entry is skipped (a plain miss), the output is exact, verify() reports it, clean() removes it."""
    tokens = text_tokens(tiny_model, 700)
    path = save_history(tiny_model, tmp_path, tokens)
    assert path.read_bytes()[:8] == MAGIC
    data_offset = header_u64(path, 104)
    assert data_offset % 4096 == 0 and header_u64(path, 112) == path.stat().st_size
    assert offset < data_offset
    flip_bit(path, offset)
    store = PersistStore(tmp_path)
    problems = store.verify()
    assert list(problems) == [path] and problems[path]
    assert_skipped_then_cleaned(tiny_model, tmp_path, tokens, store, path)
    assert store.verify() == {}


@pytest.mark.parametrize("block", [0, 3, 8])
def test_a_flipped_bit_in_block_k_restores_the_blocks_before_it(tiny_model, tmp_path, block):
    """A corrupt block is found by its checksum when read: the blocks before it are restored,
    the rest computed, the entry removed and counted as corrupt."""
    tokens = text_tokens(tiny_model, 700)
    path = save_history(tiny_model, tmp_path, tokens)
    block_bytes = BLOCK * tiny_model.kv_bytes_per_token
    data_offset = header_u64(path, 104)
    assert path.stat().st_size == data_offset + 10 * block_bytes
    flip_bit(path, data_offset + block * block_bytes + 1001, bit=6)
    store = PersistStore(tmp_path)
    assert store.verify() == {path: f"checksum mismatch in block {block}"}
    assert store.entries()[0].problem == ""  # the header is sound: only reading the data tells
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        assert stats.persist_misses_corrupt == 1
        assert stats.persist_tokens_restored == block * BLOCK
        assert stats.persist_loads == (1 if block else 0)
        assert stats.tokens_prefilled == 700 - block * BLOCK
        assert not path.exists()
        check_exact(s, tiny_model, tokens)
        # the session goes on: a second session of the same prompt is exact too
        t = ctx.session()
        t.append(tokens)
        check_exact(t, tiny_model, tokens)
    assert store.verify() == {}


def test_a_corrupt_block_within_a_longer_restore(tiny_model, tmp_path):
    """Blocks are read 16 at a time: a corrupt block in the second batch keeps the first 16+."""
    tokens = text_tokens(tiny_model, 1500)
    path = save_history(tiny_model, tmp_path, tokens)
    block_bytes = BLOCK * tiny_model.kv_bytes_per_token
    flip_bit(path, header_u64(path, 104) + 19 * block_bytes + 5)
    with persistent(tiny_model, tmp_path) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_misses_corrupt == 1
        assert s.stats.persist_tokens_restored == 19 * BLOCK
        assert not path.exists()
        check_exact(s, tiny_model, tokens)


def test_every_flipped_bit_is_found_by_verify(tiny_model, tmp_path):
    """One bit flipped anywhere in the header, the tokens, the chain, the checksums (every byte)
    or the data (300 places): verify() reports the entry; flipped back, it is sound again. (The
    padding before the 4096-aligned data is never read.)"""
    path = save_history(tiny_model, tmp_path, text_tokens(tiny_model, 700))
    e = parse_entry(path)
    store = PersistStore(tmp_path)
    rng = random.Random(7)
    meta_end = e["checksums_offset"] + 8 * e["n_blocks"]
    offsets = list(range(meta_end)) + rng.sample(range(e["data_offset"], e["file_size"]), 300)
    missed = []
    fd = os.open(path, os.O_RDWR)
    try:
        for offset in offsets:
            byte = os.pread(fd, 1, offset)[0]
            os.pwrite(fd, bytes([byte ^ (1 << offset % 8)]), offset)
            if path not in store.verify():
                missed.append(offset)
            os.pwrite(fd, bytes([byte]), offset)
    finally:
        os.close(fd)
    assert missed == []
    assert store.verify() == {}


def test_foreign_files_are_ignored_and_only_bad_entries_cleaned(tiny_model, tmp_path):
    """Files that are not entries: a random x.llkv (removed by clean, as an unreadable entry),
    notes.txt and a directory named like an entry (never touched)."""
    tokens = text_tokens(tiny_model, 700)
    path = save_history(tiny_model, tmp_path, tokens)
    garbage = tmp_path / "x.llkv"
    garbage.write_bytes(random.Random(0).randbytes(20000))
    header_only = tmp_path / "y.llkv"
    header_only.write_bytes(MAGIC + bytes(120))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (tmp_path / "sub.llkv").mkdir()
    store = PersistStore(tmp_path)
    problems = store.verify()
    assert garbage in problems and header_only in problems and path not in problems
    assert notes not in problems
    stats = restores(tiny_model, tmp_path, tokens)
    assert stats.persist_tokens_restored == 576
    assert stats.persist_misses_corrupt == 0
    assert store.clean() == 2  # (the directory cannot be unlinked: left alone)
    assert not garbage.exists() and not header_only.exists()
    assert notes.read_text() == "my notes\n"
    assert path.exists() and store.verify().keys() <= {tmp_path / "sub.llkv"}
    memo = tmp_path / "file-hashes"
    remembered = memo.exists()  # (a model file younger than its timestamps' granularity is not remembered)
    assert store.clear() == 1 + remembered  # the entry and the memo of model checksums
    assert notes.exists() and not path.exists() and not memo.exists() and (tmp_path / "sub.llkv").is_dir()


# --- failing saves --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["replaced_by_a_file", "made_writable_by_others"])
def test_an_unwritable_directory_fails_saves_and_the_session_goes_on(tiny_model, tmp_path, capfd, where):
    """persist_dir becomes unusable after the context was made (one that is unusable already is
    refused when the context is made: test_the_directory_is_checked_when_the_context_is_made):
    every save fails, is counted and says why on stderr, once; nothing else changes."""
    directory = tmp_path / "file"
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, directory, **WRITTEN_ON_SAVE) as ctx:
        if where == "replaced_by_a_file":
            for p in directory.iterdir():
                p.unlink()
            directory.rmdir()
            directory.write_text("not a directory")
        else:
            directory.chmod(0o777)
        s = ctx.session()
        s.append(tokens)
        capfd.readouterr()
        assert s.save() == 0
        assert capfd.readouterr().err.count("could not save") == 1
        assert s.stats.persist_errors == 1 and s.stats.persist_saves == 0
        assert ctx.persist.entries() == []
        check_exact(s, tiny_model, tokens)
        more = text_tokens(tiny_model, 100, seed=5)
        s.append(more)
        expected_logits, _ = reference(tiny_model, s.tokens)
        np.testing.assert_array_equal(s.logits(), expected_logits)
        s.close()  # the automatic save fails too, without raising
        assert ctx.stats.persist_errors == 2
        t = ctx.session()
        t.append(tokens)
        check_exact(t, tiny_model, tokens)
    if where == "replaced_by_a_file":
        assert directory.read_text() == "not a directory"
    else:
        assert list(directory.iterdir()) == [directory / "file-hashes"]  # nothing written


@pytest.mark.parametrize("fail_after", [1, 200, 4096 + 3, 100_000])
def test_a_full_disk_fails_the_save_and_leaves_nothing(tiny_model, tmp_path, fail_after):
    """The test hook fails writes after n bytes (in the header, the tokens, the data) as a full
    disk would: save() returns 0, counted, no entry and no temporary file left, an entry saved
    before is intact, the session goes on and saves again once there is room."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path, **WRITTEN_ON_SAVE) as ctx:
        s = ctx.session()
        s.append(tokens[:300])
        assert s.save() == 256
        [old] = llkv_files(tmp_path)
        s.append(tokens[300:])
        ctx.persist._core._fail_after_bytes(fail_after)
        assert s.save() == 0
        assert s.stats.persist_errors == 1 and s.stats.persist_saves == 1
        assert llkv_files(tmp_path) == [old] and tmp_files(tmp_path) == []
        assert PersistStore(tmp_path).verify() == {}
        check_exact(s, tiny_model, tokens)
        ctx.persist._core._fail_after_bytes(0)
        assert s.save() == 640  # (the generated tokens' KV comes from decode steps: not stored)
        assert s.stats.persist_errors == 1 and s.stats.persist_saves == 2
        assert [e.n_tokens for e in ctx.persist.entries()] == [640] and tmp_files(tmp_path) == []
    assert restores(tiny_model, tmp_path, tokens).persist_tokens_restored == 576


def test_a_full_disk_when_sessions_close_is_counted_and_nothing_left(tiny_model, tmp_path):
    """The automatic saves (session close, context close) fail without raising."""
    tokens = text_tokens(tiny_model, 700)
    with persistent(tiny_model, tmp_path, **WRITTEN_ON_SAVE) as ctx:
        ctx.persist._core._fail_after_bytes(1000)
        s = ctx.session()
        s.append(tokens)
        s.close()
        assert ctx.stats.persist_errors == 1
        t = ctx.session()
        t.append(tokens)
        check_exact(t, tiny_model, tokens)
    assert llkv_files(tmp_path) == [] and tmp_files(tmp_path) == []


def test_a_run_of_failed_saves_is_one_warning(tiny_model, tmp_path, capfd):
    """A full disk fails every save: each is counted, the first of the run says why on stderr, the
    others do not (a server's log had a line per request); once a save succeeds, the next failure
    is said again. (Written on save: behind, each prefill's write would fail and count too.)"""
    with persistent(tiny_model, tmp_path, **WRITTEN_ON_SAVE) as ctx:
        ctx.persist._core._fail_after_bytes(1000)
        capfd.readouterr()
        sessions = [ctx.session() for _ in range(4)]
        for seed, s in enumerate(sessions):
            s.append(text_tokens(tiny_model, 200, seed=seed))
            assert s.save() == 0
        assert ctx.stats.persist_errors == 4
        err = capfd.readouterr().err
        assert err.count("could not save") == 1 and "persist_errors" in err
        ctx.persist._core._fail_after_bytes(0)
        s.append(text_tokens(tiny_model, 100, seed=9))
        assert s.save() == 256
        ctx.persist._core._fail_after_bytes(1000)
        s.append(text_tokens(tiny_model, 100, seed=10))
        assert s.save() == 0
        assert capfd.readouterr().err.count("could not save") == 1
        ctx.persist._core._fail_after_bytes(0)


# --- other processes ------------------------------------------------------------------------

KILL_SCRIPT = """
    import sys
    import pyllamaopt
    from pyllamaopt import Context, OptConfig
    from test_reuse import text_tokens

    model = pyllamaopt.Model(sys.argv[1])
    base = text_tokens(model, 3900)
    with Context(model, n_ctx=8192, n_batch=256, n_seq_max=2, n_threads=2,
                 config=OptConfig(env={}, persist_enabled=True, persist_dir=sys.argv[2])) as ctx:
        s = ctx.session()
        for i in range(10000):
            s.sync(base + text_tokens(model, 130, seed=1000 + i))
            print(i, s.save(), flush=True)
"""


def test_a_process_killed_while_saving_leaves_only_sound_entries(tiny_model, tiny_model_path, tmp_path):
    """A process saving 4000-token contexts in a loop is killed (SIGKILL) while a temporary file
    is being written: every entry verifies, the temporary file is never read, a stored
    context restores exactly."""
    directory = tmp_path / "kv"
    proc = run_script(tmp_path, "saver.py", KILL_SCRIPT, tiny_model_path, directory)
    try:
        for _ in range(2):
            line = proc.stdout.readline()
            assert line.split()[1:] == ["3968"], (line, proc.stderr.read() if proc.poll() is not None else "")
        deadline = time.monotonic() + 30
        while not tmp_files(directory) and time.monotonic() < deadline:
            time.sleep(0.0002)  # a save has its temporary file open for milliseconds
        seen = tmp_files(directory)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert seen, "no save was seen in progress within 30 s"
    store = PersistStore(directory)
    entries = store.entries()
    assert len(entries) >= 2
    assert all(e.problem == "" and e.n_tokens == 3968 for e in entries)
    assert store.verify() == {}
    assert all(not e.path.name.startswith(".tmp-") for e in entries)
    left = tmp_files(directory)  # a save cut short (if the kill came before its rename)
    for name in left:
        assert (directory / name).stat().st_size <= entries[0].size

    tokens = text_tokens(tiny_model, 3900) + text_tokens(tiny_model, 130, seed=1000)
    with persistent(tiny_model, directory, n_ctx=8192) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_tokens_restored == 3904
        assert s.stats.persist_misses_corrupt == 0
        restored_logits, restored_tokens = s.logits(), ids(s.generate(6))
    with Context(tiny_model, n_ctx=8192, n_batch=256, n_seq_max=2, n_threads=2,
                 config=OptConfig(env={}, dedup_enabled=False, diff_enabled=False)) as ctx:
        s = ctx.session()
        s.append(tokens)
        np.testing.assert_array_equal(restored_logits, s.logits())
        assert restored_tokens == ids(s.generate(6))
    # leftovers of killed saves are removed by clean() once they are an hour old, never before
    assert store.clean() == 0 and tmp_files(directory) == left
    old = time.time() - 2 * 3600
    for name in left:
        os.utime(directory / name, (old, old))
    assert store.clean() == len(left) and tmp_files(directory) == []
    assert len(store.entries()) == len(entries)


CONCURRENT_SCRIPT = """
    import sys, time
    from pathlib import Path
    import numpy as np
    import pyllamaopt
    from pyllamaopt import Context, OptConfig
    from test_reuse import text_tokens

    model = pyllamaopt.Model(sys.argv[1])
    directory, go = sys.argv[2], Path(sys.argv[3])

    def make(**config):
        return Context(model, n_ctx=4096, n_batch=256, n_seq_max=4, n_threads=1, config=OptConfig(env={}, **config))

    work = [text_tokens(model, 700, seed=60 + i) for i in range(6)]
    expected = []
    for tokens in work:
        with make(dedup_enabled=False, diff_enabled=False) as ctx:
            s = ctx.session()
            s.append(tokens)
            expected.append(s.logits())
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.001)
    restored = 0
    for tokens, logits in zip(work, expected):
        with make(persist_enabled=True, persist_dir=directory) as ctx:
            s = ctx.session()
            s.append(tokens)
            assert s.save() == 640
        with make(persist_enabled=True, persist_dir=directory) as ctx:
            s = ctx.session()
            s.append(tokens)
            assert s.stats.persist_misses_corrupt == 0
            restored += s.stats.persist_tokens_restored
            np.testing.assert_array_equal(s.logits(), logits)
    print("ok", restored, flush=True)
"""


def test_two_processes_save_and_restore_the_same_contexts_at_once(tiny_model_path, tmp_path):
    """Two processes, started together, each save six contexts (the same six) and restore each
    in a fresh context: every restore is whole and bitwise equal to a computation from scratch."""
    directory, go = tmp_path / "kv", tmp_path / "go"
    procs = [run_script(tmp_path, "both.py", CONCURRENT_SCRIPT, tiny_model_path, directory, go) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.poll() is not None else ""
        go.touch()
        results = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert out.split() == ["ok", str(6 * 576)], (out, err)
    store = PersistStore(directory)
    assert len(store.entries()) == 6 and store.verify() == {} and tmp_files(directory) == []


# --- size ---------------------------------------------------------------------------------------


def test_the_size_budget_removes_the_least_recently_used_entries(tiny_model, tmp_path):
    """persist_max_mb=1: after every save the directory is cut back to 1 MiB, least recently
    used first; a restore counts as a use."""
    budget = 2**20
    histories = [text_tokens(tiny_model, 700, seed=300 + i) for i in range(8)]
    names = []
    for tokens in histories[:6]:
        names.append(save_history(tiny_model, tmp_path, tokens, persist_max_mb=1).name)
    store = PersistStore(tmp_path)
    assert store.size <= budget and len(store.entries()) == 6
    now = time.time()
    for i, name in enumerate(names):  # ages: entry 0 the oldest
        t = now - 1000 + 10 * i
        os.utime(tmp_path / name, (t, t))
    # a restore of entry 0 makes it the most recently used
    assert restores(tiny_model, tmp_path, histories[0], persist_max_mb=1).persist_tokens_restored == 576
    names.append(save_history(tiny_model, tmp_path, histories[6], persist_max_mb=1).name)
    assert store.size <= budget
    assert {e.path.name for e in store.entries()} == {names[0], *names[2:7]}
    names.append(save_history(tiny_model, tmp_path, histories[7], persist_max_mb=1).name)
    assert store.size <= budget
    assert {e.path.name for e in store.entries()} == {names[0], *names[3:8]}
    # removed entries are plain misses; the rest restore
    assert restores(tiny_model, tmp_path, histories[1], persist_max_mb=1).persist_tokens_restored == 0
    assert restores(tiny_model, tmp_path, histories[5], persist_max_mb=1).persist_tokens_restored == 576


def test_the_budget_never_removes_the_entry_just_saved(tiny_model, tmp_path):
    """Saves in quick succession (within one second, as an agent saving after every turn):
    when the budget is exceeded, the oldest entry goes, not the one save() just reported stored."""
    histories = [text_tokens(tiny_model, 700, seed=300 + i) for i in range(7)]
    with persistent(tiny_model, tmp_path, n_ctx=8192, persist_max_mb=1, **WRITTEN_ON_SAVE) as ctx:
        sessions = []
        for tokens in histories:
            sessions.append(ctx.session())
            sessions[-1].append(tokens)
        names = []
        for s in sessions[:6]:  # 6 entries fit in 1 MiB
            before = set(llkv_files(tmp_path))
            assert s.save() == 640
            [new] = set(llkv_files(tmp_path)) - before
            names.append(new)
        before = set(llkv_files(tmp_path))
        assert sessions[6].save() == 640
        after = set(llkv_files(tmp_path))
        assert len(after - before) == 1, "the entry just saved was removed by the size budget"
        assert before - after == {names[0]}, "not the least recently used entry was removed"
    assert restores(tiny_model, tmp_path, histories[6]).persist_tokens_restored == 576


def test_clean_by_age_and_size(tiny_model, tmp_path):
    """PersistStore.clean(max_age=...) removes entries unused for that long, clean(max_mb=...) the
    least recently used beyond that size; what is left restores."""
    histories = [text_tokens(tiny_model, 700, seed=400 + i) for i in range(4)]
    paths = [save_history(tiny_model, tmp_path, tokens) for tokens in histories]
    store = PersistStore(tmp_path)
    now = time.time()
    for i, path in enumerate(paths):
        t = now - (3 - i) * 86400 - 60  # 3, 2, 1 and 0 days (and a minute) old
        os.utime(path, (t, t))
    assert store.clean(max_age=10 * 86400) == 0
    assert store.clean(max_age=1.5 * 86400) == 2
    assert sorted(e.path for e in store.entries()) == sorted(paths[2:])
    entry_mb = paths[3].stat().st_size / 2**20
    assert store.clean(max_mb=1.5 * entry_mb) == 1
    assert [e.path for e in store.entries()] == [paths[3]]
    with pytest.raises(ValueError):
        store.clean(max_age=0)
    with pytest.raises(ValueError):
        store.clean(max_mb=-1)
    assert store.clean(max_age=0.5) == 1  # half a second is a limit, not "none" (it rounded to 0)
    assert store.entries() == []
    paths[3] = save_history(tiny_model, tmp_path, histories[3])
    assert restores(tiny_model, tmp_path, histories[3]).persist_tokens_restored == 576
    assert restores(tiny_model, tmp_path, histories[0]).persist_tokens_restored == 0


def test_clean_rejects_bad_limits_with_typed_errors(tmp_path):
    """Limits out of range are InvalidArgumentError (a ValueError) saying what to give instead."""
    store = PersistStore(tmp_path)
    with pytest.raises(InvalidArgumentError, match="positive number of seconds"):
        store.clean(max_age=0)
    with pytest.raises(InvalidArgumentError, match="MiB >= 0"):
        store.clean(max_mb=-1)
    for bad in (math.nan, math.inf, -math.inf, True):
        with pytest.raises(InvalidArgumentError, match="positive number of seconds"):
            store.clean(max_age=bad)
        with pytest.raises(InvalidArgumentError, match="MiB >= 0"):
            store.clean(max_mb=bad)
    assert store.clean(max_age=1e30, max_mb=1e30) == 0  # beyond the engine's integers: no limit in effect


def test_default_directory_comes_from_the_configuration(tmp_path, monkeypatch):
    """The directory a Context persists to, as OptConfig resolves persist_dir (LLAMA_OPT_PERSIST_DIR,
    validated with the other LLAMA_OPT_* variables), else the engine's default."""
    from pyllamaopt.persist import default_persist_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_persist_dir() == tmp_path / "cache" / "pyllamaopt" / "kv"
    monkeypatch.setenv("LLAMA_OPT_PERSIST_DIR", str(tmp_path / "kv"))
    assert default_persist_dir() == PersistStore().directory == tmp_path / "kv"
    assert default_persist_dir(OptConfig(env={}, persist_dir=str(tmp_path / "other"))) == tmp_path / "other"
    monkeypatch.setenv("LLAMA_OPT_PERSIST_DIRR", str(tmp_path / "typo"))
    with pytest.raises(ConfigError, match="LLAMA_OPT_PERSIST_DIRR"):
        PersistStore()


def test_the_default_directory_is_never_one_others_share(tmp_path, monkeypatch):
    """A relative XDG_CACHE_HOME is ignored (the XDG specification); without HOME, the account's
    home; without either, a directory named for the user, not /tmp/.cache, which anyone could make
    first (and then own: every context would refuse it)."""
    import pwd

    from pyllamaopt.persist import default_persist_dir

    monkeypatch.delenv("LLAMA_OPT_PERSIST_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_persist_dir() == tmp_path / ".cache" / "pyllamaopt" / "kv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME")
    account = pwd.getpwuid(os.geteuid()).pw_dir
    expected = (Path(account) / ".cache" / "pyllamaopt" / "kv" if account not in ("", "/")
                else Path(f"/tmp/pyllamaopt-{os.geteuid()}/kv"))
    assert default_persist_dir() == expected
    assert not str(default_persist_dir()).startswith("/tmp/.cache")


# --- issue 20: permissions and symbolic links -------------------------------------------------

def test_the_directory_is_private_and_entries_are_0600(tiny_model, tmp_path):
    directory = tmp_path / "a" / "kv"
    path = save_history(tiny_model, directory, text_tokens(tiny_model, 2 * BLOCK))
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700  # created parents too
    assert path.stat().st_mode & 0o777 == 0o600
    assert (directory / "file-hashes").stat().st_mode & 0o777 == 0o600


def test_the_directory_is_checked_when_the_context_is_made(tiny_model, tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        persistent(tiny_model, a_file)
    with pytest.raises(ConfigError, match="cannot create"):
        persistent(tiny_model, a_file / "kv")
    assert a_file.read_text() == "x"


def test_a_directory_others_can_write_is_refused_with_the_chmod_hint(tiny_model, tmp_path):
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(0o777)
    with pytest.raises(ConfigError, match=re.escape(f"chmod 700 {directory}")):
        persistent(tiny_model, directory)
    assert directory.stat().st_mode & 0o777 == 0o777  # not changed behind the user's back
    directory.chmod(0o770)
    with pytest.raises(ConfigError, match="writable by other users"):
        persistent(tiny_model, directory)


def test_a_directory_made_writable_by_others_is_not_read_either(tiny_model, tmp_path):
    """A context checks its directory when it is made and before every save; a lookup checks it
    too: once others can write it they could plant entries, so nothing is restored from it (a miss;
    a save says why) until it is private again."""
    directory = tmp_path / "kv"
    tokens = text_tokens(tiny_model, 700)
    save_history(tiny_model, directory, tokens)
    with persistent(tiny_model, directory, dedup_enabled=False) as ctx:  # (no blocks from RAM either)
        directory.chmod(0o777)
        s = ctx.session()
        s.append(tokens)
        assert s.stats.persist_tokens_restored == 0 and s.stats.persist_misses == 1
        check_exact(s, tiny_model, tokens)
        directory.chmod(0o700)
        t = ctx.session()
        t.append(tokens)
        assert t.stats.persist_tokens_restored == 576 and t.stats.persist_misses == 0


def test_an_older_0755_directory_is_tightened(tiny_model, tmp_path):
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(0o755)
    persistent(tiny_model, directory).close()
    assert directory.stat().st_mode & 0o777 == 0o700


def test_symbolic_links_are_never_followed(tiny_model, tmp_path):
    directory = tmp_path / "kv"
    tokens = text_tokens(tiny_model, 2 * BLOCK)
    entry = save_history(tiny_model, directory, tokens)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.llkv"
    victim.write_bytes(entry.read_bytes()[:100])  # broken: would be removed if the link were followed
    link = directory / "zz-link.llkv"
    link.symlink_to(victim)
    store = PersistStore(directory)
    problems = {e.path.name: e.problem for e in store.entries()}
    assert problems["zz-link.llkv"] == "a symbolic link (not followed)"
    assert store.verify(remove=True) == {link: "a symbolic link (not followed)"}
    assert not link.is_symlink() and victim.exists()
    link.symlink_to(victim)
    assert store.clean() == 1
    assert not link.is_symlink() and victim.exists() and entry.exists()


def test_cache_help_documents_the_permissions_and_the_command_warns(tiny_model, tmp_path, capsys):
    """`pyllamaopt cache --help` states what is enforced (each statement is tested above); the
    command warns about a directory contexts would refuse, and still lists and cleans it."""
    from pyllamaopt.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["cache", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for claim in ("created 0700 and entries 0600", "refuse a directory owned by another user or writable by group "
                  "or others (chmod 700 DIR)", "(0755, from older versions) to 0700",
                  "Symbolic links are never followed"):
        assert claim in text
    directory = tmp_path / "kv"
    save_history(tiny_model, directory, text_tokens(tiny_model, 2 * BLOCK))
    directory.chmod(0o777)
    assert "writable by other users" in PersistStore(directory).refusal()
    assert main(["cache", "ls", "--dir", str(directory)]) == 0
    out = capsys.readouterr()
    assert f"contexts with persistence refuse this directory: {directory} is writable" in out.err
    assert "1 entries" in out.out
    assert main(["cache", "clean", "--all", "--dir", str(directory)]) == 0
    assert PersistStore(directory).entries() == []
    directory.chmod(0o755)
    assert PersistStore(directory).refusal() == "" and directory.stat().st_mode & 0o777 == 0o700
    assert PersistStore(tmp_path / "missing").refusal() == ""


# --- what a second process or a long-running one leaves (review of the twelfth session) -------

def test_a_prefix_stored_already_is_marked_used_when_a_session_closes(tiny_model, tmp_path):
    """A prompt served from memory again and again is found stored already at each close: the
    entry is marked used then (its mtime), so that an age or size limit removes it last, not first."""
    tokens = text_tokens(tiny_model, 3 * BLOCK)
    with persistent(tiny_model, tmp_path) as ctx:
        first = ctx.session()
        first.append(tokens)
        assert first.save() == 3 * BLOCK
        (entry,) = llkv_files(tmp_path)
        week_ago = time.time() - 8 * 86400
        os.utime(entry, (week_ago, week_ago))
        again = ctx.session()
        again.append(tokens)  # from the RAM tier: the disk is not read
        assert again.stats.persist_tokens_restored == 0
        assert again.save() == 3 * BLOCK and again.stats.persist_saves == 0  # stored already
    assert time.time() - entry.stat().st_mtime < 600
    assert PersistStore(tmp_path).clean(max_age=7 * 86400) == 0 and entry.exists()


def test_clear_removes_leftovers_of_killed_saves_and_the_checksum_memo(tiny_model, tmp_path, capsys):
    """`clear` (the CLI's `clean --all`, the remedy for a directory others could write) also removes
    files of interrupted saves, which `ls` shows, and the memo of model checksums the engine trusts."""
    path = save_history(tiny_model, tmp_path, text_tokens(tiny_model, 2 * BLOCK))
    leftover = tmp_path / f".tmp-{path.name}.1.0"
    leftover.write_bytes(bytes(5000))
    (tmp_path / "file-hashes").write_text("0123456789abcdef 1:2 3 4.0 5.0 /planted/model.gguf\n")
    store = PersistStore(tmp_path)
    assert store.leftovers() == [(leftover, 5000)]
    assert store.clear() == 3
    assert sorted(tmp_path.iterdir()) == []


def test_a_persist_dir_that_is_not_utf8_is_refused_with_a_message(tmp_path):
    name = os.fsdecode(bytes(tmp_path) + b"/kv-\xff")
    with pytest.raises(InvalidArgumentError, match="not a valid UTF-8 path"):
        PersistStore(name)
