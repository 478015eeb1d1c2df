"""Whether the Ray cluster `pyllamaopt serve --ray` runs on is still there, asked without Ray's own
calls: those retry a lost GCS for a minute (gcs_rpc_server_reconnect_timeout_s), hanging meanwhile,
before Ray ends the process with a fatal log that says nothing of what to do. A TCP connect to the
GCS's port (to Ray Client's server, with a ray:// address) answers at once; a cluster this process
started (no RAY_ADDRESS) is watched through its processes too: its GCS or raylet exiting ends it."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WATCH_EVERY = 1.0       # seconds between two looks
CONNECT_TIMEOUT = 3.0   # seconds for the GCS's port to take a connection
MISSES = 2              # looks in a row the GCS refuses (or lets time out) before it counts as gone
_VITAL = ("gcs_server", "raylet")  # a cluster of our own lives as long as these (ray_constants.PROCESS_TYPE_*)


@dataclass
class ClusterWatch:
    host: str
    port: int
    service: str     # what listens there: the GCS, or Ray Client's server (a ray:// address)
    node: Any        # the node this process started (Ray's Node: its processes), None for a cluster joined
    processes: set[tuple[int, str]] = field(default_factory=set)  # under this one as the watch began: (pid, start)
    misses: int = 0

    @classmethod
    def of_this_driver(cls) -> ClusterWatch:
        """The cluster ray.init connected this process to."""
        import ray
        from ray._private import worker  # (the Node a ray.init(address="local") started holds its processes)

        given = os.environ.get("RAY_ADDRESS", "")
        client = given.startswith("ray://")
        address = given.removeprefix("ray://") if client else ray.get_runtime_context().gcs_address
        host, _, port = address.rpartition(":")
        node: Any = worker._global_node  # (None until ray.init, for mypy always)
        own = node is not None and bool(node.all_processes)
        return cls(host, int(port), "Ray Client server" if client else "GCS", node if own else None,
                   _descendants(os.getpid(), _process_table()) if own else set())

    def wait_until_lost(self) -> str:
        """Returns only when the cluster went away: what went, and what to do, as a sentence."""
        while (lost := self.lost()) is None:
            time.sleep(WATCH_EVERY)
        return lost

    def lost(self) -> str | None:
        """None while the cluster is there, else what went and what to do."""
        gone = self._gone()
        if gone is None:
            return None
        if self.node is not None:
            return (f"the Ray cluster this server started went away ({gone}; Ray's logs: "
                    f"{self.node.get_logs_dir_path()}): start pyllamaopt serve --ray again")
        return (f"the Ray cluster at {self.host}:{self.port} went away ({gone}): start the cluster again "
                "(ray start --head ...), or point RAY_ADDRESS at a running one, then pyllamaopt serve --ray")

    def _gone(self) -> str | None:
        """What of the cluster is gone; None: nothing (yet)."""
        if self.node is not None:
            exited = sorted({kind for kind, _ in self.node.dead_processes() if kind in _VITAL})
            if exited:
                return f"its {' and '.join(exited)} process exited"
        try:
            socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT).close()
        except OSError as exc:
            self.misses += 1
            return f"its {self.service} does not answer: {exc.strerror or type(exc).__name__}" \
                if self.misses >= MISSES else None
        self.misses = 0
        return None

    def end(self) -> None:
        """Kills what is left of a cluster of our own (ray.shutdown would wait on the lost GCS): every
        process under this one, and those that were when the watch began (its raylet's agents outlive
        it, their parent gone)."""
        if self.node is None:
            return
        table = _process_table()
        for pid, started in self.processes | _descendants(os.getpid(), table):
            if table.get(pid, (0, ""))[1] == started:  # (the same process, not a pid used again)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.node.kill_all_processes(check_alive=False, allow_graceful=False)


def _process_table() -> dict[int, tuple[int, str]]:
    """{pid: (its parent's pid, its start time)} of every process, from /proc (none where there is no /proc)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # (after the command's name, which may hold spaces)
        except OSError:  # (gone meanwhile)
            continue
        table[int(stat.parent.name)] = (int(fields[1]), fields[19])
    return table


def _descendants(pid: int, table: dict[int, tuple[int, str]]) -> set[tuple[int, str]]:
    """The processes under `pid`: (pid, start time)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, pending = set(), [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add((child, table[child][1]))
            pending.append(child)
    return found
