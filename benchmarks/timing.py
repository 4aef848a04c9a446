"""Helpers shared by the benchmark scripts: best-of-N wall time of a command, and an
in-process run of a tpubuild verb that reports whether TensorFlow got imported."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

_PROBE = """
import contextlib, io, sys, time
t = time.perf_counter()
from tpubuild.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()):
        main({argv!r})
except SystemExit as exc:
    code = exc.code
tf = any(m == "tensorflow" or m.startswith("tensorflow.") for m in sys.modules)
print(f"  in-process: {{time.perf_counter() - t:.3f}} s, exit {{code}}, tensorflow imported: {{tf}}")
"""


def best_of(runs: int, argv: list[str], cwd: Path) -> float:
    """The fastest of `runs` wall-clock runs of `argv` (each must exit 0)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        assert out.returncode == 0, out.stderr
    return best


def probe_in_process(argv: list[str], cwd: Path) -> None:
    """Run `tpubuild ARGV` in a fresh interpreter; it prints its time and TF-freeness."""
    subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], cwd=cwd, check=True)
