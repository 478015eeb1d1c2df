"""Faults at the HTTP level, with a real `pyllamaopt serve` process and real clients: the disk tier's
directory full or read-only (requests go on, failed saves are counted in the metrics and said once
in the log), and clients that leave mid-stream (the server comes back to where it was)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import random
import resource
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from test_serve import Server, start_server, stop_server
from test_serve_restart import persistent, system_prompt
from tinymodel import CHATML, write_tiny_llama

# A directory too small for any entry of the tiny model (a 64-token block of KV is 32 KiB) but
# large enough for the memo of the model file's checksum.
FULL_BYTES = 16 * 1024
WARNING = "could not save the KV of a session"


@pytest.fixture
def chat_model(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny-chatml.gguf", chat_template=CHATML)


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


def can_mount() -> bool:
    """Whether this process may mount file systems (root, and not refused by a container)."""
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/pyllamaopt-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        run("mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(probe))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    finally:
        subprocess.run(["umount", str(probe)], capture_output=True)
        probe.rmdir()
    return True


@contextlib.contextmanager
def full_disk(directory: Path, how: str) -> Iterator[Callable[[], None] | None]:
    """`directory` on a disk with FULL_BYTES of room: a tmpfs of that size ("tmpfs", which needs
    root), or any file system with the server's files limited to that size ("rlimit": writes past
    it fail with EFBIG, the server's SIGXFSZ ignored). Yields the server's preexec_fn."""
    directory.mkdir(mode=0o700)
    if how == "rlimit":
        def limit() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FULL_BYTES, FULL_BYTES))

        yield limit
        return
    run("mount", "-t", "tmpfs", "-o", f"size={FULL_BYTES},mode=0700", "tmpfs", str(directory))
    try:
        yield None
    finally:
        run("umount", "-l", str(directory))


# The capabilities that let root pass permission bits (linux/capability.h): writing and searching where
# the bits say no, and chmod of what it does not own; prctl's call that takes one out of the bounding set.
PERMISSION_OVERRIDES = {"CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3}
PR_CAPBSET_DROP = 24


def without_permission_overrides() -> None:
    """Run in the server's process before it starts, as root: PERMISSION_OVERRIDES leave its bounding
    set, so that the program it executes has them no more (root's inheritable and ambient sets are
    empty: a program root executes gets the bounding set), and permission bits stop it as they stop
    any user. (An unprivileged user cannot run the server here: the interpreter is under /root, 0700.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    for name, number in PERMISSION_OVERRIDES.items():
        if libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {name})")


def effective_capabilities(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)


@contextlib.contextmanager
def read_only(directory: Path, how: str) -> Iterator[Callable[[], None] | None]:
    """`directory` made read-only: a read-only bind mount of it over itself ("bind mount", as root),
    or mode 0500 ("mode 0500"), which stops a server that runs as any user but root, or as root
    without the capabilities that pass permission bits. Yields the server's preexec_fn."""
    if how == "bind mount":
        run("mount", "--bind", str(directory), str(directory))
        run("mount", "-o", "remount,bind,ro", str(directory))
        try:
            yield None
        finally:
            run("umount", "-l", str(directory))
        return
    directory.chmod(0o500)
    try:
        yield without_permission_overrides if os.geteuid() == 0 else None
    finally:
        directory.chmod(0o700)


def chat(server: Server, k: int) -> str:
    reply = server.client().chat.completions.create(
        model="m", max_tokens=6, messages=[{"role": "system", "content": system_prompt(k)},
                                           {"role": "user", "content": "and now?"}])
    return reply.choices[0].message.content


def make_saves(server: Server, prompts: range) -> list[str]:
    """Requests whose KV the server saves, or tries to: chat requests (more than the idle request
    sessions kept, so that some close) and protocol sessions closed at once. Returns the answers."""
    answers = [chat(server, k) for k in prompts]
    for k in prompts:
        tokens = server.request("POST", "/v1/tokenize", {"text": system_prompt(100 + k)})[1]["tokens"]
        status, body = server.request("POST", "/v1/sessions", {"tokens": tokens})
        assert status == 201, body
        assert server.request("DELETE", f"/v1/sessions/{body['session_id']}")[0] == 204
    return answers


def failed_saves(server: Server, at_least: int) -> float:
    """The metric of failed saves once it counts `at_least` (saves written behind may come a little
    after the requests that caused them; each probe is a protocol session with a block of its own,
    closed: one more save, written behind 0.25 s later or on close)."""
    for probe in range(50):
        errors = server.metrics()["pyllamaopt_persist_errors_total"]
        if errors >= at_least:
            return errors
        time.sleep(0.1)
        status, body = server.request("POST", "/v1/sessions", {"tokens": list(range(10 + probe, 80 + probe))})
        assert status == 201, body
        server.request("DELETE", f"/v1/sessions/{body['session_id']}")
    pytest.fail(f"persist_errors stayed at {errors} (< {at_least})")


WAYS = ["tmpfs", "rlimit"] if can_mount() else ["rlimit"]


@pytest.mark.parametrize("how", WAYS)
def test_a_full_disk_fails_saves_and_requests_go_on(chat_model, tmp_path, how):
    """The disk tier's directory on a full disk (a small tmpfs; without root, a file size limit on
    the server process): every request is answered as without persistence, every save fails and is
    counted in the metrics, the log says so once (it said it for every save)."""
    reference = start_server(chat_model, tmp_path)  # no disk tier
    try:
        expected = [chat(reference, k) for k in range(6)]
    finally:
        stop_server(reference)
    directory = tmp_path / "kv"
    with full_disk(directory, how) as preexec_fn:
        server = start_server(chat_model, tmp_path, env=persistent(tmp_path), preexec_fn=preexec_fn)
        try:
            assert make_saves(server, range(6)) == expected
            errors = failed_saves(server, at_least=2 + 6)  # two request sessions closed for room, six sessions
            metrics = server.metrics()
            assert metrics["pyllamaopt_persist_saves_total"] == 0
            assert server.request("GET", "/health")[0] == 200
        finally:
            stop_server(server)  # (the drain's saves fail too, quietly)
        assert not [p for p in directory.iterdir() if p.suffix == ".llkv" or p.name.startswith(".tmp-")]
    log = server.log.read_text()
    assert log.count(WARNING) == 1, log
    assert "persist_errors" in log and errors >= 8


READ_ONLY_WAYS = ["bind mount", "mode 0500"] if can_mount() else ["mode 0500"]


@pytest.mark.parametrize("write_behind", ["1", "0"], ids=["behind", "on-close"])
@pytest.mark.parametrize("how", READ_ONLY_WAYS)
def test_a_read_only_directory_restores_and_counts_the_saves_it_cannot_make(chat_model, tmp_path, how, write_behind):
    """A warm cache made read-only (a read-only bind mount, as root; mode 0500, the server run as
    root without the capabilities that pass permission bits, or as the user running the tests):
    the server restores what it holds, answers everything as before, and counts every save it
    cannot make in the metrics, said once in its log (behind: a write queued behind one that
    failed, which it extends, fails with it and is counted too)."""
    env = persistent(tmp_path)
    first = start_server(chat_model, tmp_path, env=env)
    try:
        expected = [chat(first, k) for k in range(6)]
    finally:
        stop_server(first)
    directory = tmp_path / "kv"
    stored = sorted(p.name for p in directory.iterdir())
    with read_only(directory, how) as preexec_fn:
        server = start_server(chat_model, tmp_path, env={**env, "LLAMA_OPT_PERSIST_WRITE_BEHIND": write_behind},
                              preexec_fn=preexec_fn)
        try:
            if preexec_fn is not None:  # (the permission bits are tested on a server that has none of them)
                overrides = sum(1 << n for n in PERMISSION_OVERRIDES.values())
                assert not effective_capabilities(server.process.pid) & overrides
            assert make_saves(server, range(6)) == expected
            metrics = server.metrics()
            assert metrics["pyllamaopt_prompt_tokens_restored_total"] > 0  # the six chat prompts, from disk
            errors = failed_saves(server, at_least=6)  # the six protocol sessions' prompts are new
            assert server.metrics()["pyllamaopt_persist_saves_total"] == 0
        finally:
            stop_server(server)
    assert sorted(p.name for p in directory.iterdir()) == stored
    log = server.log.read_text()
    why = "Read-only file system" if how == "bind mount" else "Permission denied"
    assert log.count(WARNING) == 1 and why in log and errors >= 6, log


def server_rss(server: Server) -> int:
    """The server process's resident memory, in KiB."""
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


SOAK_WORDS = 40  # (twelve prompts and their answers at once fit the context)


def stream_and_leave(server: Server, k: int, leave_after: int | None) -> None:
    """One client: a streamed chat completion (even k) or a protocol session's streamed generation
    (odd k, the session closed afterwards), read for `leave_after` events then dropped (None: to
    its end)."""
    if k % 2 == 0:
        stream = server.client().chat.completions.create(
            model="m", max_tokens=40, stream=True,
            messages=[{"role": "system", "content": system_prompt(k, SOAK_WORDS)}, {"role": "user", "content": "go on"}])
        with contextlib.closing(stream):
            for i, _ in enumerate(stream):
                if leave_after is not None and i >= leave_after:
                    break
        return
    tokens = server.request("POST", "/v1/tokenize", {"text": system_prompt(k, SOAK_WORDS)})[1]["tokens"]
    session_id = server.request("POST", "/v1/sessions", {"tokens": tokens})[1]["session_id"]
    request = urllib.request.Request(f"{server.url}/v1/sessions/{session_id}/generate", method="POST",
                                     data=b'{"max_tokens": 40, "stream": true}',
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        for i, _ in enumerate(response):
            if leave_after is not None and i >= leave_after:
                break
    # the generation ends when the server sees the client gone: until then the session is busy (409)
    for _ in range(100):
        status, _ = server.request("DELETE", f"/v1/sessions/{session_id}")
        if status == 204:
            return
        assert status == 409, status
        with contextlib.suppress(Exception):
            urllib.request.urlopen(f"{server.url}/health", timeout=5).read()
    pytest.fail(f"session {session_id} stayed busy after its client left")


def test_clients_leaving_mid_stream_leave_the_server_as_it_was(chat_model, tmp_path):
    """12 clients streaming at once (chat completions and protocol sessions), most leaving at a
    random point, three rounds: a request afterwards gets the answer it got before, the server's
    memory is back within 10 % of what it was, and no session is left open."""
    server = start_server(chat_model, tmp_path, "--n-ctx", "4096")
    picks = random.Random(42)
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as clients:
            def round_(leaving: bool) -> None:
                leave = [picks.choice([None, 0, 1, 3, 8, 20]) if leaving else None for _ in range(12)]
                list(clients.map(lambda k: stream_and_leave(server, k, leave[k]), range(12)))

            round_(leaving=False)  # warm: what a server that has served these holds
            before = chat(server, 99), server_rss(server)
            for _ in range(3):
                round_(leaving=True)
        after = chat(server, 99), server_rss(server)
        metrics = server.metrics()
    finally:
        stop_server(server)
    assert after[0] == before[0]
    assert after[1] <= before[1] * 1.10, f"RSS {before[1]} KiB before, {after[1]} KiB after"
    assert metrics["session_active"] == 0
    assert metrics["cache_invariant_violations_total[('kind', 'inv1')]"] == 0
