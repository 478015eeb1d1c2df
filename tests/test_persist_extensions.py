"""Extensions (format version 2, docs/persist-format.md "Write-behind"): the background writer
stores a grown context as an entry extending the one of its first blocks, holding only the new
blocks' rows, so an agent history written turn by turn costs about one KV row per computed token,
not the whole history again per turn. A parent that is missing or has a bad block ends a restore
before its blocks (a miss, never wrong KV); `clean` removes extensions whose parent is gone."""
from __future__ import annotations

from pyllamaopt import PersistStore
from test_persist import BLOCK, flip_bit, header_u64, restores, run_script
from test_cli import run
from test_reuse import text_tokens

GROW_SCRIPT = """
    import sys
    from pyllamaopt import Context, Model, OptConfig
    from test_reuse import text_tokens

    model = Model(sys.argv[1])
    config = OptConfig(env={}, persist_enabled=True, persist_dir=sys.argv[2])
    ctx = Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2, config=config)
    s, tokens, start = ctx.session(), text_tokens(model, 700), 0
    for stop in (150, 420, 700):  # the history after each turn: 2, 6 and 10 complete blocks
        s.append(tokens[start:stop])
        start = stop
        assert ctx.flush_persist(timeout=60)
    print(s.stats.persist_bytes_written, flush=True)
    ctx.close()
"""


def grow(model_path, tmp_path):
    """Another process writes a 700-token history in 3 turns; returns its bytes written."""
    proc = run_script(tmp_path, "grow.py", GROW_SCRIPT, model_path, tmp_path / "kv")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return int(out.split()[0])


def by_tokens(directory):
    return {e.n_tokens: e for e in PersistStore(directory).entries()}


def test_a_growing_history_writes_only_each_turns_blocks(tiny_model, tiny_model_path, tmp_path):
    """Each turn's entry extends the one before it: its file holds the new blocks' rows (and the
    tables), the parents stay, and a new process restores the whole history bit for bit."""
    written = grow(tiny_model_path, tmp_path)
    entries = by_tokens(tmp_path / "kv")
    assert sorted(entries) == [128, 384, 640]
    assert [entries[n].base_tokens for n in (128, 384, 640)] == [0, 128, 384]
    block_bytes = BLOCK * tiny_model.kv_bytes_per_token
    for n, e in entries.items():
        own = (n - e.base_tokens) // BLOCK
        assert own * block_bytes < e.size <= own * block_bytes + 8192  # the rows, the tables, the alignment
    assert written == sum(e.size for e in entries.values())
    assert written < 1.1 * 640 * tiny_model.kv_bytes_per_token  # about one row per stored token
    assert PersistStore(tmp_path / "kv").verify() == {}
    tokens = text_tokens(tiny_model, 700)
    stats = restores(tiny_model, tmp_path / "kv", tokens)
    assert stats.persist_tokens_restored == 576 and stats.persist_misses_corrupt == 0


def test_a_removed_parent_is_a_miss_for_its_blocks_and_clean_removes_the_orphan(tiny_model, tiny_model_path, tmp_path):
    """The middle entry removed (by hand, another process): the last one, an orphan, is never used
    (its blocks below the parent are not stored); verify says why; a lookup finds the first entry's
    blocks; clean removes the orphan."""
    grow(tiny_model_path, tmp_path)
    kv = tmp_path / "kv"
    by_tokens(kv)[384].path.unlink()
    store = PersistStore(kv)
    orphan = by_tokens(kv)[640].path
    problems = store.verify()
    assert list(problems) == [orphan] and "parent entry (blocks 0-5) is missing" in problems[orphan]
    assert store.clean() == 1 and sorted(by_tokens(kv)) == [128]
    tokens = text_tokens(tiny_model, 700)
    stats = restores(tiny_model, kv, tokens)  # (checked exact)
    assert stats.persist_tokens_restored == 128 and stats.tokens_prefilled == 700 - 128


def test_an_orphan_is_passed_over_by_a_lookup(tiny_model, tiny_model_path, tmp_path):
    grow(tiny_model_path, tmp_path)
    kv = tmp_path / "kv"
    by_tokens(kv)[384].path.unlink()
    stats = restores(tiny_model, kv, text_tokens(tiny_model, 700))  # (checked exact)
    assert stats.persist_tokens_restored == 128 and stats.persist_misses_corrupt == 0
    assert PersistStore(kv).clean() <= 1 and PersistStore(kv).verify() == {}  # rewritten by that session, or removed


def test_a_bad_block_of_a_parent_ends_the_restore_before_it(tiny_model, tiny_model_path, tmp_path):
    """A flipped bit in the middle entry's second own block (block 3 of the history): blocks 0-2 are
    restored (from two files), the rest computed; the output is exact; the bad parent is removed."""
    grow(tiny_model_path, tmp_path)
    kv = tmp_path / "kv"
    parent = by_tokens(kv)[384].path
    flip_bit(parent, header_u64(parent, 104) + BLOCK * tiny_model.kv_bytes_per_token + 999, bit=6)
    assert PersistStore(kv).verify() == {parent: "checksum mismatch in block 3"}
    tokens = text_tokens(tiny_model, 700)
    stats = restores(tiny_model, kv, tokens)  # (checked exact)
    assert stats.persist_misses_corrupt == 1 and stats.persist_tokens_restored == 3 * BLOCK
    PersistStore(kv).clean()
    assert PersistStore(kv).verify() == {}
    # the first restore's session wrote behind what the bad parent had held: all restored again
    assert restores(tiny_model, kv, tokens).persist_tokens_restored == 576  # (checked exact)


def test_cache_ls_shows_what_an_entry_extends(tiny_model_path, tmp_path):
    """Each extension's line: its own file's size, its total tokens, what it extends."""
    grow(tiny_model_path, tmp_path)
    listing = run("cache", "ls", "--dir", str(tmp_path / "kv"))
    assert listing.returncode == 0, listing.stderr
    lines = [line for line in listing.stdout.splitlines() if ".llkv" in line]
    assert len(lines) == 3
    assert sum("extends the entry of its first 384 tokens" in line for line in lines) == 1
    assert sum("extends the entry of its first 128 tokens" in line for line in lines) == 1
