"""A stage's key covers the code that runs it, and a lock file's `planning` line the code
that decides keys: an edit of the build loop or the worker pool changes neither, so no lock
file (issue 40), and neither does a module added beside them, with no list to update
(issue 49 item 5). Real edits of a copy of the package, run in real processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tpubuild
from tests.cli import CLI
from tests.example_workspace import copy_built_examples
from tpubuild.keys.code import (
    PACKAGE_ROOT,
    RUNTIME_MODULES,
    closure,
    planning_files,
    planning_roots,
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


# Code that runs a build but decides no key: the build loop, the pool, the commands, review,
# publishing's destinations, the remote cache. Layering keeps them out of every key's closure;
# this is a check of that, not a list the digest reads.
NEVER_IN_A_KEY = ("cli.py", "commands/", "engine/loop.py", "engine/version.py", "engine/lockdoc.py",
                  "engine/events.py", "engine/options.py", "engine/cache.py", "engine/tasks.py", "workers/pool.py",
                  "review/", "remote/", "diagnosis/", "publish/destination.py", "publish/to_destination.py",
                  "publish/refresh.py", "publish/dest_state.py", "publish/dest_survey.py", "publish/dest_write.py",
                  "publish/dest_mend.py", "publish/dest_claims.py")


def test_the_code_that_decides_keys_is_the_closure_of_the_planning_roots_and_reaches_no_upper_layer():
    files = planning_files()
    code = {rel for rel in files if rel.endswith(".py")}
    assert code == {path.relative_to(PACKAGE_ROOT).as_posix() for path in closure(planning_roots()).values()}
    leaks = sorted(rel for rel in code if any(rel == entry or (entry.endswith("/") and rel.startswith(entry))
                                              for entry in NEVER_IN_A_KEY))
    assert leaks == []
    assert {"config/recipe.py", "engine/resolver.py", "stages/verify.py", "workers/process.py"} <= code
    assert any(rel.endswith("recipe.schema.json") for rel in files), sorted(files)


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


def _added_copy(tmp_path: Path, *files: str) -> Path:
    """A copy of the installed package with a new module at each of `files`."""
    parent = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, parent / "tpubuild", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        (parent / "tpubuild" / rel).write_text('"""A new helper."""\n\nfrom tpubuild.errors import TpubuildError\n')
    return parent


def test_a_module_added_to_engine_publish_and_commands_changes_no_digest(tmp_path):
    original = _digests(Path(tpubuild.__file__).resolve().parents[1])
    added = ("engine/zz_new_helper.py", "publish/zz_new_helper.py", "commands/zz_new_helper.py")
    assert _digests(_added_copy(tmp_path / "a", *added)) == original
    # One that the resolver (which decides keys) imports is in the digest.
    parent = _added_copy(tmp_path / "b", "engine/zz_new_helper.py")
    with open(parent / "tpubuild" / "engine" / "resolver.py", "a") as handle:
        handle.write("\nfrom tpubuild.engine import zz_new_helper  # noqa: E402,F401\n")
    assert _digests(parent)["planning"] != original["planning"]


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_a_comment_edit_of_the_pool_and_the_loop_leaves_every_example_lock_file_unchanged(built_examples, tmp_path):
    """The example workspace, built, relocked by a tpubuild whose pool and build loop gained a
    comment and whose engine/, publish/ and commands/ gained a module: every lock file byte for byte (`.ci/run`'s own check of the lock files)."""
    ws = tmp_path / "ws"
    copy_built_examples(built_examples, ws)
    relock = [*CLI, "build", "--relock"]
    done = subprocess.run(relock, cwd=ws, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    before = {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}
    parent = _edited_copy(tmp_path, "workers/pool.py", "engine/loop.py")
    for rel in ("engine/zz_new_helper.py", "publish/zz_new_helper.py", "commands/zz_new_helper.py"):
        (parent / "tpubuild" / rel).write_text('"""A new helper nothing that decides a key imports."""\n')
    env = {**os.environ, "PYTHONPATH": str(parent)}
    done = subprocess.run(relock, cwd=ws, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\d+ recipes: \d+ cached", done.stdout.strip().splitlines()[-1]), done.stdout  # no key changed
    after = {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}
    assert after == before
