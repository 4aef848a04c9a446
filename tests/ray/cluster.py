"""A real local Ray cluster for the tests and benchmarks/ray_build.py: `ray start --head
--block` in a process group of its own, on free ports (so it never meets another
cluster on this machine), stopped by signalling that group only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator

from tests.cli import REPO

# `ray start` prints this line once the head node (GCS, raylet) accepts drivers.
STARTED = "Ray runtime started"
START_TIMEOUT = 180.0
PORT_OPTIONS = ("--port", "--ray-client-server-port", "--dashboard-port", "--dashboard-agent-listen-port",
                "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
                "--node-manager-port", "--object-manager-port")


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (held open together, so they differ)."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@contextmanager
def local_cluster(num_cpus: int = 2, resources: dict[str, float] | None = None) -> Iterator[str]:
    """A head node running this checkout's tpubuild, with its own node-local store;
    yields its address (host:port)."""
    # Short: Ray's unix socket paths under --temp-dir must fit in 107 bytes.
    temp = tempfile.mkdtemp(prefix="tpr", dir="/tmp")
    ports = free_ports(len(PORT_OPTIONS))
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
               "--num-cpus", str(num_cpus), "--disable-usage-stats", "--include-dashboard=false",
               "--node-ip-address", "127.0.0.1", "--temp-dir", temp]
    for option, port in zip(PORT_OPTIONS, ports):
        command += [option, str(port)]
    if resources:
        command += ["--resources", json.dumps(resources)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), TPUBUILD_RAY_NODE_CACHE=os.path.join(temp, "node"))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    started = threading.Event()
    output: list[str] = []

    def drain() -> None:  # read `ray start`'s output to its end, so it never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if STARTED in line:
                started.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        if not started.wait(START_TIMEOUT):
            raise RuntimeError("the Ray head node did not start:\n" + "".join(output[-30:]))
        yield f"127.0.0.1:{ports[0]}"
    finally:
        stop_group(proc)
        shutil.rmtree(temp, ignore_errors=True)


def stop_group(proc: subprocess.Popen) -> None:
    """Stop `ray start --block` and every process it started (they share its process
    group); SIGKILL what a SIGTERM did not stop in 3 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
