"""Ray executor tests: one real local Ray cluster per session (`ray start --head` in a
process group of its own, on free ports so it never meets another cluster on this
machine), real builds through it with a `file://` remote cache."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.engine.conftest import tiny_saved_model  # noqa: F401  (the session's tiny SavedModel)

# `ray start` prints this line once the head node (GCS, raylet) accepts drivers.
STARTED = "Ray runtime started"
START_TIMEOUT = 180.0


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (all held open together, so they differ)."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="session")
def ray_address() -> str:
    """The address of a 2-CPU local Ray cluster, stopped (its whole process group) at the end."""
    # Short: Ray's unix socket paths under --temp-dir must fit in 107 bytes.
    temp = tempfile.mkdtemp(prefix="tpr", dir="/tmp")
    port, client, dashboard, agent, agent_grpc, metrics, runtime_env, node_manager, object_manager = free_ports(9)
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    command = [
        ray, "start", "--head", "--block", "--num-cpus", "2", "--disable-usage-stats", "--include-dashboard=false",
        "--node-ip-address", "127.0.0.1", "--port", str(port), "--ray-client-server-port", str(client),
        "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agent),
        "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
        "--runtime-env-agent-port", str(runtime_env), "--node-manager-port", str(node_manager),
        "--object-manager-port", str(object_manager), "--temp-dir", temp,
        "--resources", '{"tpubuild_test_accelerator": 2}',  # a custom resource, as a TPU host has TPU
    ]
    # The workers import this checkout's tpubuild; each cluster gets its own node-local store.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), TPUBUILD_RAY_NODE_CACHE=os.path.join(temp, "node"))
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
        yield f"127.0.0.1:{port}"
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
