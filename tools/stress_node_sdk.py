"""sdks/typescript's node suite, many times, on a loaded machine: races that a quiet machine hides.

    python tools/stress_node_sdk.py [--runs 20] [--hogs N] [--only PATTERN] [--model GGUF]

Starts the three servers tests/test_grpc.py::test_typescript_sdk gives the suite (the tiny test model
unless --model; one plain with --max-sessions 3, one with --session-ttl 3, one with --api-key sesame),
and `hogs` CPU-bound processes (default: one per core, as `stress --cpu` does) at this process's own
niceness, so that the servers and node compete with them for every core; then runs `node --test test/`
`runs` times and prints each run's counts, the output of each failing run, and the total. Exits 1 if a
run failed. The hogs and servers end with it. Run it under `nice` on a shared machine: the hogs then
take from this run, not from other work.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPESCRIPT = ROOT / "sdks" / "typescript"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, workdir: Path, *args: str) -> tuple[subprocess.Popen, str, str]:
    """A `pyllamaopt serve` process with a gRPC port; its HTTP URL and gRPC address once it answers."""
    port, grpc_port = free_port(), free_port()
    log = (workdir / f"server-{port}.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(model),
                                "--port", str(port), "--grpc-port", str(grpc_port), "--n-ctx", "1024",
                                "--threads", "2", *args], cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return process, url, f"127.0.0.1:{grpc_port}"
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit(f"the server did not start: see {log.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="CPU-bound processes (0: none)")
    parser.add_argument("--only", help="node --test-name-pattern: only the tests whose names match")
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the tiny test model)")
    options = parser.parse_args()
    node = shutil.which("node")
    if node is None:
        sys.exit("node is not on PATH: the TypeScript SDK's tests need Node 20+")
    workdir = Path(tempfile.mkdtemp(prefix="stress-node-sdk-"))
    model = options.model
    if model is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from tinymodel import write_tiny_llama

        model = write_tiny_llama(workdir / "tiny-llama.gguf")
    processes: list[subprocess.Popen] = []
    failed = 0
    try:
        servers = {}
        for name, args in (("", ("--max-sessions", "3")), ("TTL_", ("--session-ttl", "3")),
                           ("KEY_", ("--api-key", "sesame"))):
            process, url, grpc_address = start_server(model, workdir, *args)
            processes.append(process)
            servers[f"PYLLAMAOPT_{name}URL"], servers[f"PYLLAMAOPT_{name}GRPC_URL"] = url, grpc_address
        processes += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(options.hogs)]
        command = [node, "--test", *(["--test-name-pattern", options.only] if options.only else []), "test/"]
        print(f"+ {' '.join(command)} x {options.runs}, {options.hogs} CPU hogs, servers' logs in {workdir}")
        for run in range(1, options.runs + 1):
            started = time.monotonic()
            result = subprocess.run(command, cwd=TYPESCRIPT, capture_output=True, text=True, timeout=900,
                                    env={**os.environ, **servers})
            counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", result.stdout, re.MULTILINE))
            ok = result.returncode == 0 and counts.get("fail") == "0" and counts.get("cancelled") == "0"
            failed += not ok
            print(f"run {run}: {'ok' if ok else 'FAILED'} (pass {counts.get('pass')}, fail {counts.get('fail')}, "
                  f"cancelled {counts.get('cancelled')}) in {time.monotonic() - started:.0f} s", flush=True)
            if not ok:
                print(result.stdout + result.stderr, flush=True)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
    print(f"{options.runs - failed} of {options.runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
