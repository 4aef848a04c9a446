"""Issue 38 items 2, 3 and 6: a revert restores the committed lock file byte for byte;
variables that do not change an artifact do not change a lock file; a build that only
re-measured publishes no new version; gc keeps what the last build used."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import (
    as_another_machine_wrote_it,
    build_json,
    source_recipe,
    statuses,
)
from tpubuild.digests import ENV_THREADS, key_env, worker_env

THREADS = {name: "1" for name in ENV_THREADS}


def _git(ws: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True, check=True,
                            env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                 "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    return result.stdout


def _committed(ws: Path) -> None:
    """The workspace as a git repository with its recipes and lock files committed."""
    (ws / ".gitignore").write_text("out/\n.tpubuild/\n")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "recipes and lock files")


def _locks(ws: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}


@pytest.mark.slow
def test_a_change_and_its_revert_leave_git_clean(built_workspace):
    ws = built_workspace
    # Committed from another machine: a build keeps its measured lines while the keys
    # match, and so does the revert of a change built here (lockfile.recall).
    for lock in (ws / "recipes").glob("*.lock.yaml"):
        lock.write_text(as_another_machine_wrote_it(lock.read_text()))
    _committed(ws)
    recipe = ws / "recipes" / "toy.yaml"
    committed = recipe.read_text()
    for changed, said in ((source_recipe("toy", timeout=200), "published: toy -> out/toy/2\n"),
                          (source_recipe("toy", samples=5), "toy: out/toy/3 unchanged (report updated)\n")):
        recipe.write_text(changed)
        result = tpubuild(ws, "build", "toy")
        assert result.returncode == 0, result.stderr
        assert said in result.stdout, result.stdout
        assert _git(ws, "status", "--porcelain") == " M recipes/toy.lock.yaml\n M recipes/toy.yaml\n"
        recipe.write_text(committed)
        build_json(ws, "toy")
        # Whatever versions out/ holds now, the lock file is the committed one again.
        assert _git(ws, "status", "--porcelain") == ""
    assert "published_version" not in (ws / "recipes" / "toy.lock.yaml").read_text()


def test_thread_variables_reach_the_workers_unkeyed():
    environ = {"PATH": "/bin", "TF_ENABLE_ONEDNN_OPTS": "0", **THREADS}
    assert key_env(environ) == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert {name: worker_env(environ)[name] for name in ENV_THREADS} == THREADS


def test_thread_variables_leave_every_lock_file_byte_identical(built_workspace):
    ws = built_workspace
    before = _locks(ws)
    check = tpubuild(ws, "build", "--check", env=THREADS)
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n"), check.stderr
    doc = build_json(ws, env=THREADS)
    assert {row["status"] for row in doc["rows"]} == {"cached"}
    relock = tpubuild(ws, "build", "--relock", env=THREADS)
    assert relock.returncode == 0, relock.stderr
    assert _locks(ws) == before


def test_a_key_variable_still_changes_the_keys(built_workspace):
    ws = built_workspace
    check = tpubuild(ws, "build", "--check", env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert check.returncode == 1
    assert "environment variable TF_ENABLE_ONEDNN_OPTS: added (\"0\")" in check.stdout, check.stdout


def test_a_lock_file_with_a_published_version_is_read_and_rewritten_without_it(built_workspace):
    ws = built_workspace
    lock = ws / "recipes" / "toy.lock.yaml"
    current = lock.read_text()
    lock.write_text(current.replace("\nartifact:", "\npublished_version: 7\nartifact:"))
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1
    assert "toy.lock.yaml: the lock file records the published version's number" in check.stdout, check.stdout
    doc = build_json(ws)
    assert {row["status"] for row in doc["rows"]} == {"cached"}
    assert lock.read_text() == current


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_describes_itself(version_dir: Path) -> None:
    """`tpubuild verify` passes, and the provenance statement names every file's bytes."""
    verify = tpubuild(version_dir.parents[2], "verify", str(version_dir))
    assert verify.returncode == 0, verify.stderr
    statement = json.loads((version_dir / "tpubuild-provenance.json").read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    files = {p.relative_to(version_dir).as_posix(): _sha256(p) for p in version_dir.rglob("*")
             if p.is_file() and p.name != "tpubuild-provenance.json"}
    assert subjects == files


def test_a_rebuild_that_only_remeasures_updates_the_newest_version_in_place(built_workspace):
    ws = built_workspace
    recipe = ws / "recipes" / "toy.yaml"
    version = ws / "out" / "toy" / "1"
    model = {p: p.read_bytes() for p in version.rglob("*") if p.is_file() and "report" not in p.name}
    model.pop(version / "tpubuild-manifest.json")
    model.pop(version / "tpubuild-provenance.json")
    old_manifest = json.loads((version / "tpubuild-manifest.json").read_text())
    old_report = (version / "tpubuild-report.json").read_bytes()
    # A tolerance reruns verify (and the report that shows it); the model is the same.
    recipe.write_text(source_recipe("toy").replace("verify: {samples: 4}", "verify: {samples: 4, rtol: 0.5}"))
    result = tpubuild(ws, "build", "toy")
    assert result.returncode == 0, result.stderr
    assert "toy: publish: built" in result.stdout
    assert "toy: out/toy/1 unchanged (report updated)\n" in result.stdout
    assert "published:" not in result.stdout
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1"]
    manifest = json.loads((version / "tpubuild-manifest.json").read_text())
    assert manifest["content"] != old_manifest["content"] and manifest["model"] == old_manifest["model"]
    assert (manifest["version"], manifest["created"]) == (1, old_manifest["created"])
    assert (version / "tpubuild-report.json").read_bytes() != old_report  # the new tolerance in it
    assert {p: p.read_bytes() for p in model} == model  # the model files: the same bytes
    _assert_describes_itself(version)
    doc = build_json(ws)
    assert {row["status"] for row in doc["rows"]} == {"cached"}
    assert doc["versions"] == {"cut": 1, "other": 1, "toy": 1}
    damage = tpubuild(ws, "verify-cache")
    assert damage.returncode == 0, damage.stdout + damage.stderr
    assert damage.stdout.endswith(" 0 published files restored, 0 damaged files left\n"), damage.stdout
    # Back to the committed tolerance: version 1 again, with the first figures.
    recipe.write_text(source_recipe("toy"))
    doc = build_json(ws, "toy")
    assert doc["versions"] == {"toy": 1} and sorted(os.listdir(ws / "out" / "toy")) == ["1"]
    assert json.loads((version / "tpubuild-manifest.json").read_text())["content"] == old_manifest["content"]
    _assert_describes_itself(version)


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_a_target_re_measured_updates_the_target_version_in_place(make_workspace):
    recipe = source_recipe("tgt") + "targets: {cpu_savedmodel: {}}\n"
    ws = make_workspace({"tgt": recipe})
    assert build_json(ws)["versions"] == {"tgt": 1}
    target = ws / "out" / "tgt" / "cpu_savedmodel" / "1"
    old = json.loads((target / "tpubuild-manifest.json").read_text())
    (ws / "recipes" / "tgt.yaml").write_text(recipe.replace("{cpu_savedmodel: {}}", "{cpu_savedmodel: {rtol: 0.5}}"))
    doc = build_json(ws)
    assert statuses(doc, "tgt")["cpu_savedmodel_verify"] == "built"
    assert statuses(doc, "tgt")["cpu_savedmodel"] == "cached"
    assert doc["versions"] == {"tgt": 1}
    assert sorted(os.listdir(ws / "out" / "tgt")) == ["1", "cpu_savedmodel"]
    assert sorted(os.listdir(ws / "out" / "tgt" / "cpu_savedmodel")) == ["1"]
    new = json.loads((target / "tpubuild-manifest.json").read_text())
    assert new["content"] != old["content"] and new["files"] == old["files"]
    _assert_describes_itself(ws / "out" / "tgt" / "1")
    statement = json.loads((target / "tpubuild-provenance.json").read_text())
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}["tpubuild-manifest.json"] == \
        _sha256(target / "tpubuild-manifest.json")
    assert {row["status"] for row in build_json(ws)["rows"]} == {"cached"}


def test_gc_keeps_the_measured_records_the_last_build_used(built_workspace):
    ws = built_workspace
    # Lock files another machine wrote: its measured keys are not this machine's, and a
    # build keeps them (only measured keys differ), so they name records this cache lacks.
    for lock in (ws / "recipes").glob("*.lock.yaml"):
        lock.write_text(as_another_machine_wrote_it(lock.read_text()))
    assert {row["status"] for row in build_json(ws)["rows"]} == {"cached"}
    gc = tpubuild(ws, "gc", "--keep-days", "0")
    assert gc.returncode == 0, gc.stderr
    doc = build_json(ws)
    assert {row["status"] for row in doc["rows"]} == {"cached"}, [r for r in doc["rows"] if r["status"] != "cached"]
    # A change, built, is what the last build used: the records it replaced go.
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=5))
    build_json(ws, "toy")
    gc = tpubuild(ws, "gc", "--keep-days", "0")
    assert gc.returncode == 0 and not gc.stdout.startswith("removed 0 stage entries"), gc.stdout
    assert {row["status"] for row in build_json(ws)["rows"]} == {"cached"}
