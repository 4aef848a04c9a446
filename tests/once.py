"""What a heavy session fixture builds, built once per test run rather than once per xdist worker.

A session fixture runs once in each process: under `pytest -n 2` each worker would build
the same workspace again (a minute or more of CPU for the example workspace). The
fixtures that build such a workspace write it under this run's temporary directory, which
the workers share, under a file lock: the first worker to need it builds it, the other
waits for it and reads the same files. It suits these fixtures because what they make are
files that tests only read (a test that changes one copies it first). The fixtures of
one module's tests are grouped on one worker instead (tests/conftest.py GROUPED_FIXTURES);
these are read by the tests of many modules (the engine's built workspace: 15).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary directory: above each xdist worker's own, shared by all of them."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`<run directory>/<name>/`, filled by `make(directory)` once per test run. A `make`
    that fails leaves no mark of being done: the next fixture to ask builds it again (and
    fails the same way), rather than reading half a workspace."""
    from filelock import FileLock

    shared = run_directory(tmp_path_factory)
    directory, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            if directory.exists():
                shutil.rmtree(directory)  # an attempt of this run that failed half-way
            directory.mkdir()
            make(directory)
            done.write_text("")
    return directory


def built_once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                       build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """(`<run directory>/<name>/ws`, what `build(ws)` returned: a JSON document), made once
    per test run: the workspace a session fixture builds, and its `build --json` document."""

    def make(directory: Path) -> None:
        document = build(directory / "ws")
        (directory / "document.json").write_text(json.dumps(document))

    directory = once_per_run(tmp_path_factory, name, make)
    return directory / "ws", json.loads((directory / "document.json").read_text())
