"""On a terminal, a build shows a live line with the running stage, its recipe and the
elapsed time; piped, it shows none (issue 8)."""

from __future__ import annotations

import os
import pty
import subprocess

from tests.engine.conftest import CLI, REPO, export_recipe


def test_live_progress_line_on_a_tty_only(make_workspace):
    ws = make_workspace({"exp": export_recipe("exp")})
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([*CLI, "build"], cwd=ws, stdout=secondary, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(primary)
    out = b"".join(chunks).decode()
    assert proc.returncode == 0
    assert "running exp: export" in out  # the live line: recipe, stage, elapsed seconds
    assert "\r\x1b[K" in out  # redrawn in place, then cleared before each finished stage
    assert "exp: export: built (" in out
    piped = subprocess.run([*CLI, "build", "--json"], cwd=ws, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "running" not in piped.stdout
