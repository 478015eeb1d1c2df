"""`pyllamaopt serve --kv-type-k / --kv-type-v` (issue 46), llama-server's --cache-type-k / -v: a
server process on Gemma 3 270M with a q8_0 K and a q4_0 V keeps each session's KV in that pair's
bytes and answers bitwise as the library does with the same pair; a type it does not know stops
it before the model loads, naming the allowed ones."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pyllamaopt import Context, OptConfig
from test_kv_type_gemma import BYTES_PER_32_VALUES
from test_reuse_gemma import SYSTEM
from test_serve import N_CTX, completion_tokens, start_server, stop_server

pytestmark = pytest.mark.integration


def test_the_server_stores_k_and_v_in_the_types_given_and_answers_as_the_library(gemma_path, gemma, tmp_path):
    prompt = gemma.tokenize(SYSTEM)[:300]
    server = start_server(gemma_path, tmp_path, "--kv-type-k", "q8_0", "--kv-type-v", "q4_0")
    try:
        status, body = server.request("POST", "/v1/sessions", {"tokens": prompt})
        assert status == 201, body
        status, info = server.request("GET", f"/v1/sessions/{body['session_id']}")
        assert status == 200, info
        # Gemma 3 270M: K and V heads of 256 values each, each half of F16's bytes per token
        assert info["kv_bytes"] * 2 * BYTES_PER_32_VALUES["f16"] == \
            len(prompt) * gemma.kv_bytes_per_token * (BYTES_PER_32_VALUES["q8_0"] + BYTES_PER_32_VALUES["q4_0"])
        served, _ = completion_tokens(server, prompt, 24)
        assert server.request("GET", "/health")[1]["kv_type"] == "q8_0/q4_0"  # K's, then V's
    finally:
        stop_server(server)
    with Context(gemma, n_ctx=N_CTX, n_threads=2, config=OptConfig(env={}, kv_type_k="q8_0", kv_type_v="q4_0")) as ctx:
        session = ctx.session()
        session.append(prompt)
        assert served == [t.id for t in session.generate(24)]


def test_an_unknown_v_type_stops_the_server_before_the_model_loads(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tmp_path / "none.gguf"),
                             "--kv-type-v", "q5_0"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert "--kv-type-v q5_0: must be one of f16, q8_0, q4_0" in result.stderr  # (the option given, not the field)
    assert "Traceback" not in result.stderr and "none.gguf" not in result.stderr


def test_the_server_says_its_kv_type_and_how_to_see_its_entries(gemma_path, gemma, tmp_path):
    """The ready line and /health name the KV type that runs; the start's notice of entries it never
    restores (an f16 context's, here) gives the cache commands this server's --kv-type, without which
    `cache clean --foreign` would take the f16 entries for its own and remove its q8_0 ones."""
    kv = tmp_path / "kv"
    with Context(gemma, n_ctx=N_CTX, n_threads=2, config=OptConfig(env={}, persist_enabled=True, persist_dir=str(kv))) as ctx:
        session = ctx.session()
        session.append(gemma.tokenize(SYSTEM)[:200])
        assert session.save() == 192
    server = start_server(gemma_path, tmp_path, "--kv-type", "q8_0",
                          env={"LLAMA_OPT_PERSIST_ENABLED": "1", "LLAMA_OPT_PERSIST_DIR": str(kv)})
    try:
        status, health = server.request("GET", "/health")
        assert status == 200 and health["kv_type"] == "q8_0", health
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert f"(n_ctx {N_CTX}, kv_type q8_0); Ctrl-C stops it" in log, log
    assert f"1 of 1 entries in {kv} are for another model, build or KV type" in log, log
    assert f"`pyllamaopt cache clean --foreign --model {gemma_path} --kv-type q8_0` removes them" in log, log
