"""A stage's key covers the code that runs it, and a lock file's `planning` line the code
that decides keys: an edit of the build loop or the worker pool changes neither, so no lock
file (issue 40). Real edits of a copy of the package, run in real processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tpubuild
from tpubuild.keys.code import (
    NOT_PLANNING,
    PACKAGE_ROOT,
    PLANNING_ROOTS,
    RUNTIME_MODULES,
    closure,
    planning,
    stage_modules,
)

DIGESTS = ("import json; from tpubuild.keys.code import code_digest, planning_code_digest, stage_modules; "
           "print(json.dumps({'planning': planning_code_digest(), "
           "'stages': {m: code_digest(m) for m in stage_modules()}}))")


def _digests(package_parent: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    result = subprocess.run([sys.executable, "-c", DIGESTS], cwd=package_parent, env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    return json.loads(result.stdout)


def _edited_copy(tmp_path: Path, *files: str) -> Path:
    """A copy of the installed package with a comment appended to each of `files`."""
    parent = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, parent / "tpubuild", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        with open(parent / "tpubuild" / rel, "a") as handle:
            handle.write("# a comment: the code that runs is the same\n")
    return parent


def test_no_key_reaches_a_file_left_out_of_planning():
    reached = closure((*PLANNING_ROOTS, *stage_modules(), *RUNTIME_MODULES))
    leaks = sorted(name for name, path in reached.items()
                   if not planning(path.relative_to(PACKAGE_ROOT).as_posix()))
    assert leaks == []
    for rel in ("engine/loop.py", "workers/pool.py", "commands/build.py", "cli.py"):
        assert not planning(rel), rel
    assert len(NOT_PLANNING) == len(set(NOT_PLANNING))


def test_a_stage_closure_holds_the_worker_process_not_the_pool_or_the_loop():
    files = {p.relative_to(PACKAGE_ROOT).as_posix() for p in closure(("tpubuild.stages.verify", *RUNTIME_MODULES)).values()}
    assert {"workers/process.py", "handoff.py", "stages/base.py", "stages/verify.py"} <= files
    assert not {"workers/pool.py", "engine/loop.py", "engine/resolver.py", "store/store.py"} & files


def test_an_edit_of_the_pool_or_the_loop_changes_no_digest_and_a_stage_edit_only_its_own(tmp_path):
    original = _digests(Path(tpubuild.__file__).resolve().parents[1])
    assert _digests(_edited_copy(tmp_path / "a", "workers/pool.py", "engine/loop.py")) == original
    edited = _digests(_edited_copy(tmp_path / "b", "stages/report.py"))
    changed = sorted(m for m in original["stages"] if edited["stages"][m] != original["stages"][m])
    assert changed == ["tpubuild.stages.report"]
    assert edited["planning"] != original["planning"]  # a stage's code decides its key


def test_a_comment_edit_of_the_pool_and_the_loop_leaves_every_example_lock_file_unchanged(built_examples, tmp_path):
    """The example workspace, built, relocked by a tpubuild whose pool and build loop gained a
    comment: every lock file byte for byte (`.ci/run`'s own check of the lock files)."""
    ws = tmp_path / "ws"
    shutil.copytree(built_examples, ws, symlinks=True)
    relock = [sys.executable, "-m", "tpubuild", "build", "--relock"]
    done = subprocess.run(relock, cwd=ws, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    before = {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}
    parent = _edited_copy(tmp_path, "workers/pool.py", "engine/loop.py")
    env = {**os.environ, "PYTHONPATH": str(parent)}
    done = subprocess.run(relock, cwd=ws, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\d+ recipes: \d+ cached", done.stdout.strip().splitlines()[-1]), done.stdout  # no key changed
    after = {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}
    assert after == before
