"""The one way tests run the `tpubuild` command, and where the repository is.

`tpubuild(cwd, *args)` runs the CLI as a user does: a fresh process (`python -m tpubuild`), so
a test sees the real exit code, the real stdout and stderr, and nothing the test process
imported (TensorFlow, a changed environment) leaks into it. `PYTHONPATH` points at this
checkout, so the process runs the code under test even where another tpubuild is installed.
`run_cli(*argv)` runs it in this process instead, for the planning verbs whose tests are many
and cheap (no TensorFlow, no process start).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tpubuild"]


def tpubuild(cwd: Path | str | None, *args: str, timeout: float | None = 600, env: Mapping[str, str] | None = None,
             base_env: Mapping[str, str] | None = None, code: int | None = None) -> subprocess.CompletedProcess:
    """`tpubuild ARGS...` in a fresh process run from `cwd`, its output captured as text.

    `env` is laid over `base_env` (this process's environment unless given: a test of what
    the user's environment does passes its own). `code`, when given, is the exit code the
    command must end with; the assertion's message is its whole output.
    """
    environment = {**(os.environ if base_env is None else base_env), "PYTHONPATH": str(REPO), **(env or {})}
    done = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment,
                          check=False)
    if code is not None:
        assert done.returncode == code, done.stdout + done.stderr
    return done


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`tpubuild ARGV...` in this process: (exit code, stdout, stderr). An exception other than
    SystemExit escapes: that would be a traceback."""
    from tpubuild.cli import (
        main,  # here, not at the top: the subprocess runner's users need no tpubuild import
    )

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()
