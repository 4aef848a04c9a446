"""Safety: corrupted cache objects, SIGKILL mid-stage, concurrent builds, failing recipes
under -j 2, unwritable outputs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import build_json, export_recipe, lock_record, statuses
from tpubuild.digests import hash_file


def _start_build(ws: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [*CLI, "build", "--json"], cwd=ws, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_corrupted_cache_object_is_detected_and_rebuilt(built_workspace):
    ws = built_workspace
    entry = yaml.safe_load(lock_record(ws, "cut").read_text())
    note = next(f for f in entry["files"] if f[0] == "assets/note.txt")
    obj = ws / ".tpubuild" / "cache" / "v1" / "objects" / note[1][:2] / note[1][2:]
    os.chmod(obj, 0o644)
    obj.write_text("corrupted")
    os.utime(ws / "recipes" / "models" / "notes.py")  # nothing changed but a timestamp
    (ws / "out" / "cut").rename(ws / "out-cut-aside")  # the fast path must not hide the bad object
    doc = build_json(ws, "cut")
    assert statuses(doc, "cut") == {"export": "built", "verify": "cached", "report": "cached", "publish": "built"}
    assert hash_file(obj) == note[1]
    assert (ws / "out" / "cut" / "1" / "assets" / "note.txt").read_text() == "first"


def test_sigkill_in_the_middle_of_a_stage_then_a_rebuild_succeeds(make_workspace):
    ws = make_workspace({"cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    slow = ws / "recipes" / "models" / "SLOW"
    slow.write_text("hold the export stage")
    build = _start_build(ws)
    log = ws / ".tpubuild" / "logs" / "worker-0.log"
    _wait_for(lambda: log.exists() and "stage export (pid" in log.read_text())
    worker_pid = int(re.search(r"stage export \(pid (\d+)\)", log.read_text()).group(1))
    build.send_signal(signal.SIGKILL)
    build.wait()
    _wait_for(lambda: not Path(f"/proc/{worker_pid}").exists() or "zombie" in _proc_state(worker_pid), 10)
    assert not (ws / "recipes" / "cut.lock.yaml").exists()
    assert not (ws / "out").exists()
    slow.unlink()
    doc = build_json(ws)
    assert statuses(doc, "cut") == {"export": "built", "verify": "built", "report": "built", "publish": "built"}
    assert sorted(os.listdir(ws / "out" / "cut")) == ["1"]
    assert os.listdir(ws / ".tpubuild" / "cache" / "v1" / "tmp") == []


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_two_concurrent_builds_of_one_workspace(make_workspace):
    ws = make_workspace({"cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    first, second = _start_build(ws), _start_build(ws)
    outs = [p.communicate(timeout=300) for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    import json

    docs = [json.loads(out) for out, _ in outs]
    all_statuses = sorted(tuple(sorted(set(statuses(doc, "cut").values()))) for doc in docs)
    assert all_statuses == [("built",), ("cached",)]
    waiting = [err for _, err in outs if "waiting for another tpubuild build of this workspace (held by pid " in err]
    assert len(waiting) == 1
    assert sorted(os.listdir(ws / "out" / "cut")) == ["1"]


def test_failing_recipe_under_j2_stops_only_its_own_chain(make_workspace):
    ws = make_workspace({
        "good": export_recipe("good", "models/copy_export.py", "models/notes.py"),
        "bad": export_recipe("bad", "models/bad_export.py", "models/notes.py"),
    })
    result = tpubuild(ws, "build", "-j", "2", "--json")
    assert result.returncode == 1
    import json

    doc = json.loads(result.stdout)
    assert statuses(doc, "bad") == {"export": "failed", "verify": "skipped", "report": "skipped", "publish": "skipped"}
    assert statuses(doc, "good") == {"export": "built", "verify": "built", "report": "built", "publish": "built"}
    assert result.stderr.strip().splitlines()[-1] == (
        "recipes/bad.yaml: stage export: recipes/models/bad_export.py: export: raised ValueError: no model today "
        "(at recipes/models/bad_export.py:2 in export)"
    )
    assert (ws / "recipes" / "good.lock.yaml").exists()
    assert not (ws / "recipes" / "bad.lock.yaml").exists()
    assert not (ws / "out" / "bad").exists()


def test_unwritable_output_dir_is_a_clear_error_with_nothing_written(built_workspace):
    ws = built_workspace
    (ws / "blocker").write_text("a file where a directory should be")
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\noutput_dir: blocker/out\n')
    lock_before = (ws / "recipes" / "toy.lock.yaml").read_text()
    result = tpubuild(ws, "build", "toy")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"recipes/toy.yaml: stage publish: cannot write the output directory {ws}/blocker/out/toy: Not a directory"
    )
    assert (ws / "recipes" / "toy.lock.yaml").read_text() == lock_before


def test_a_local_record_naming_a_path_outside_the_cache_is_removed_and_rebuilt(built_workspace, tmp_path):
    # Whoever can write a shared cache_dir can write its records: a local record is checked
    # like a downloaded one (keys/records.py), never trusted for the paths it names.
    ws = built_workspace
    record = lock_record(ws, "cut")
    entry = yaml.safe_load(record.read_text())
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    depth = len(record.relative_to(tmp_path).parts) + 2
    entry["files"][0][0] = "../" * depth + str(victim.relative_to("/"))
    os.chmod(record, 0o644)
    record.write_text(json.dumps(entry))
    (ws / "out" / "cut").rename(ws / "out-cut-aside")  # make the build read the record
    result = tpubuild(ws, "build", "--json", "cut")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "the user's file"
    warnings = [line for line in result.stderr.splitlines() if "cache record" in line]
    assert len(warnings) == 1 and "is invalid (unsafe path" in warnings[0] and "the stage rebuilds" in warnings[0]
    assert statuses(json.loads(result.stdout), "cut")["export"] == "built"
    assert (ws / "out" / "cut" / "1" / "assets" / "note.txt").read_text() == "first"


@pytest.mark.slow
def test_keep_going_publishes_what_verified_when_a_target_fails(make_workspace):
    # make -k: one target failing (an XLA AOT signature the model does not have, found only
    # when the stage runs) fails the build, but the TPU SavedModel and the CPU target that
    # built and verified are published; without -k nothing of the recipe is.
    from tests.engine.conftest import source_recipe

    recipe = source_recipe("kg") + ("targets:\n  tpu_savedmodel: {}\n  cpu_savedmodel: {}\n"
                                    "  xla_aot: {signatures: [no_such_signature], batch_sizes: [1]}\n")
    ws = make_workspace({"kg": recipe, "toy": source_recipe("toy")})
    plain = tpubuild(ws, "build", "--json")
    assert plain.returncode == 1
    assert statuses(json.loads(plain.stdout), "kg")["publish"] == "skipped"
    assert not (ws / "out" / "kg").exists()
    assert (ws / "out" / "toy" / "1").is_dir()  # another recipe builds either way

    result = tpubuild(ws, "build", "--json", "--keep-going")
    assert result.returncode == 1, result.stderr
    rows = statuses(json.loads(result.stdout), "kg")
    assert rows["xla_aot"] == "failed" and rows["xla_aot_verify"] == "skipped", rows
    assert rows["publish"] == "built" and rows["cpu_savedmodel_verify"] in ("built", "cached"), rows
    assert [line for line in result.stderr.splitlines() if "stage xla_aot:" in line], result.stderr
    assert (ws / "out" / "kg" / "1" / "saved_model.pb").is_file()
    assert (ws / "out" / "kg" / "cpu_savedmodel" / "1" / "saved_model.pb").is_file()
    assert not (ws / "out" / "kg" / "xla_aot").exists()
    assert not (ws / "recipes" / "kg.lock.yaml").exists()  # a lock file describes a whole build
