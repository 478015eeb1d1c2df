"""A `pyllamaopt serve` process for the session-protocol benchmarks (transport_overhead.py, soak.py):
started on free loopback ports with HTTP and gRPC, stopped with SIGTERM; and what /proc says of it."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Served:
    process: subprocess.Popen
    url: str           # HTTP
    address: str       # gRPC host:port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model: str, *args: str, log: Path) -> Iterator[Served]:
    port, grpc_port = _free_port(), _free_port()
    process = subprocess.Popen([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", model, "--port", str(port),
                                "--grpc-port", str(grpc_port), *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, log)
        yield Served(process, url, f"127.0.0.1:{grpc_port}")
    finally:
        stop(process)


def wait_ready(process: subprocess.Popen, url: str, log: Path, seconds: float = 300) -> None:
    """Returns once the server at `url` answers /health; a SystemExit with its log if it exits first
    or does not answer within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url + "/health", timeout=5).close()
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the server did not answer within {seconds:g} s:\n{log.read_text()}")
        time.sleep(0.2)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (the server drains and saves), then a kill if it has not ended within 60 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def process_status(pid: int) -> dict[str, int]:
    """Resident memory (bytes), threads and open file descriptors of a process (Linux /proc)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss": int(fields["VmRSS"].split()[0]) * 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU time each thread of a process has run, in seconds (Linux schedstat: nanoseconds)."""
    seconds = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            seconds[task] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0]) / 1e9
    return seconds


def load_average() -> float:
    return os.getloadavg()[0]
