"""The pyllamaopt command line, run as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

# the installed console script, run outside the checkout (whose pyllamaopt/ has no _core)
CLI = Path(sys.executable).parent / "pyllamaopt"


def run(*args, env=None, input=None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_OPT_")}
    environment.update(env or {})
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=environment, input=input,
                              cwd=cwd, timeout=300)


def test_help_names_every_command():
    result = run("--help")
    assert result.returncode == 0
    for command in ("run", "chat", "demo", "config", "info", "cache"):
        assert command in result.stdout
    assert "LLAMA_OPT_" in result.stdout


def test_config_shows_values_and_sources():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "32"})
    assert result.returncode == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("block_size"))
    assert line.split()[:3] == ["block_size", "32", "environment"]
    assert "h2o" in result.stdout and "compiled" in result.stdout
    without = next(l for l in result.stdout.splitlines() if l.strip().startswith("noop_enabled") and "no effect" in l)
    assert "measured not to pay" in without


def test_config_list_names_every_variable():
    result = run("config", "--list")
    assert result.returncode == 0
    assert "LLAMA_OPT_DIFF_MIN_UNCHANGED" in result.stdout and "LLAMA_OPT_MODEL" in result.stdout
    # float defaults as they were written, not the C float's binary expansion (0.0010000000474974513)
    threshold = next(line for line in result.stdout.splitlines() if "LLAMA_OPT_ATTN_PRUNE_THRESHOLD" in line)
    assert threshold.split()[3] == "0.001", threshold


def test_malformed_variable_is_a_clear_error():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "abc"})
    assert result.returncode == 2
    assert "LLAMA_OPT_BLOCK_SIZE=abc" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_on_a_model_file(tiny_model_path):
    result = run("run", "--model", str(tiny_model_path), "-n", "8", "-t", "2", "the capital of france is")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_run_reads_stdin_and_model_from_the_environment(tiny_model_path):
    result = run("run", "-n", "4", env={"LLAMA_OPT_MODEL": str(tiny_model_path)}, input="hello world")
    assert result.returncode == 0, result.stderr


def test_chat_needs_a_template(tiny_model_path):
    result = run("chat", "--model", str(tiny_model_path), input="hi\n")
    assert result.returncode == 2
    assert "no chat template" in result.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    result = run("run", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert result.returncode == 2
    assert "No such file" in result.stderr and "Traceback" not in result.stderr


def test_info(tiny_model_path):
    result = run("info", "--model", str(tiny_model_path))
    assert result.returncode == 0
    assert "llama_cpp_commit" in result.stdout and "layers 2" in result.stdout


def test_cache_ls_verify_clean(tiny_model, tmp_path):
    """Entries written by a context with persistence on, listed, verified and cleaned by the CLI
    (which needs no model); a corrupt entry is reported by verify and removed by clean."""
    from pyllamaopt import Context, OptConfig

    kv = tmp_path / "kv"
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(kv))
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2, config=config) as ctx:
        for seed in (1, 2):
            s = ctx.session()
            s.append([(seed * 37 + i) % 200 + 3 for i in range(300)])
            assert s.save() == 256
    env = {"LLAMA_OPT_PERSIST_DIR": str(kv)}
    listing = run("cache", "ls", env=env)
    assert listing.returncode == 0 and f"{kv}: 2 entries" in listing.stdout
    assert listing.stdout.count("256 tokens") == 2
    assert run("cache", "verify", env=env).returncode == 0

    entry = sorted(kv.glob("*.llkv"))[0]
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # in the last block's rows
    entry.write_bytes(bytes(data))
    verify = run("cache", "verify", "--dir", str(kv))
    assert verify.returncode == 1 and "checksum mismatch" in verify.stdout and "1 bad" in verify.stdout
    cleaned = run("cache", "clean", "--dir", str(kv))
    assert cleaned.returncode == 0 and "removed 0 file(s); 2 entries left" in cleaned.stdout  # sound headers
    removed = run("cache", "verify", "--remove", "--dir", str(kv))
    assert removed.returncode == 0 and "1 entries left, 1 bad (removed)" in removed.stdout
    assert "removed 1 file(s); 0 entries left" in run("cache", "clean", "--all", "--dir", str(kv)).stdout
    assert run("cache", "clean", "--max-age", "-1", "--dir", str(kv)).returncode != 0
