"""A hanging stage never hangs the build: stage_timeout kills it, and SIGINT to the
build's own pid (not its process group) stops it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import export_recipe, statuses

HANG = "import time\n\n\ndef export(output_dir):\n    open('STARTED', 'w').close()\n    time.sleep(3600)\n"


def _hanging_workspace(make_workspace, timeout: float | None = None):
    ws = make_workspace({"hang": export_recipe("hang", "models/hang.py", "models/helper.py")})
    (ws / "recipes" / "models" / "hang.py").write_text(HANG)
    if timeout is not None:
        with open(ws / "tpubuild.yaml", "a") as f:
            f.write(f"stage_timeout: {timeout}\n")
    return ws


@pytest.mark.slow
def test_stage_timeout_kills_the_worker_and_fails_the_stage(make_workspace):
    import json

    ws = _hanging_workspace(make_workspace, timeout=20)
    start = time.monotonic()
    result = tpubuild(ws, "build", "--json", timeout=120)
    assert result.returncode == 1
    assert time.monotonic() - start < 90
    assert "recipes/hang.yaml: stage export: timed out after 20 s (stage_timeout); the worker was killed" in result.stderr
    assert statuses(json.loads(result.stdout), "hang") == {
        "export": "failed", "verify": "skipped", "report": "skipped", "publish": "skipped"}
    leftovers = subprocess.run(["pgrep", "-f", "tpubuild.workers.process"], capture_output=True, text=True).stdout
    for pid in leftovers.split():
        cmdline = open(f"/proc/{pid}/environ", "rb").read() if os.path.exists(f"/proc/{pid}/environ") else b""
        assert str(ws).encode() not in cmdline  # no worker of this workspace survives


def test_sigint_to_the_build_pid_stops_it_at_once(make_workspace):
    ws = _hanging_workspace(make_workspace)
    # Started as a terminal starts it, SIGINT at its default: a suite run in the background
    # of a non-interactive shell (`nohup ... &`) ignores SIGINT, children inherit that, and
    # Python then installs no KeyboardInterrupt handler (the build rightly keeps ignoring
    # it, as every program started in the background does).
    proc = subprocess.Popen([*CLI, "build"], cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Generous: the export worker imports TensorFlow first, which on a loaded 2-core CI
    # machine has taken more than two minutes.
    deadline = time.monotonic() + 600
    while not (ws / "recipes" / "models" / "STARTED").exists():  # an export runs beside its script
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5  # the worker is killed, not waited for (was 10 s)
    assert proc.returncode != 0
    assert "Traceback" not in err
