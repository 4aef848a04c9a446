"""Helpers shared by the benchmark scripts: best-of-N wall time of a command, and an
in-process run of a tpubuild verb that reports whether TensorFlow got imported."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

_PROBE = """
import contextlib, io, sys, time
t = time.perf_counter()
from tpubuild.entry import main
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


def best_of_cpu(runs: int, argv: list[str], cwd: Path, before: Callable[[], None] | None = None,
                check: Callable[[subprocess.CompletedProcess], None] | None = None) -> tuple[float, float]:
    """(fastest wall time, least CPU time: user + system) of `runs` runs of `argv`, each
    after `before()`. On a machine shared with other work the CPU time is the fair
    figure: wall time there measures the queue for a core as much as the command."""
    wall = cpu = float("inf")
    for _ in range(runs):
        if before is not None:
            before()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        wall = min(wall, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = min(cpu, after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime)
        if check is not None:
            check(out)
        else:
            assert out.returncode == 0, out.stderr
    return wall, cpu


def probe_in_process(argv: list[str], cwd: Path) -> None:
    """Run `tpubuild ARGV` in a fresh interpreter; it prints its time and TF-freeness."""
    subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], cwd=cwd, check=True)
