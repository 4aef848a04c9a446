"""Report in verify's worker (engine/loop.py HANDOFF) on the CPU twin verify made
(tpu/twin.py cpu_twin): the same output as a report made alone, in a fresh worker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.engine.conftest import (
    build_json,
    lock_record,
    save_placed_model,
    statuses,
    write_workspace,
)

RECIPE = """\
name: placed
model: {saved_model: models/tiny}
converter:
  tpu_functions: [{function_alias: tpu_func}]
verify: {samples: 4}
"""


@pytest.fixture(scope="module")
def tpu_saved_model(tmp_path_factory) -> Path:
    """`y = x @ w` behind a serving signature that calls it under the alias `tpu_func`."""
    return save_placed_model(tmp_path_factory.mktemp("models") / "placed")


def _stages_per_worker(logs: list[Path]) -> list[list[str]]:
    return [re.findall(r"^--- stage (\S+) \(pid", log.read_text(), re.M) for log in sorted(logs)]


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_report_on_verifys_twin_equals_a_report_made_alone(tmp_path, tpu_saved_model):
    ws = write_workspace(tmp_path / "ws", tpu_saved_model, {"placed": RECIPE})
    own = {"TPUBUILD_OWN_WORKER_MIN_BYTES": "1"}  # the tiny model as a large one: workers of their own
    first = build_json(ws, env=own)
    assert statuses(first, "placed")["report"] == "built", first
    logs = ws / ".tpubuild" / "logs"
    # Verify in the worker of the transform before it (engine/loop.py _hands_on), report after it.
    assert any(stages[-2:] == ["verify", "report"] for stages in _stages_per_worker(list(logs.glob("worker-*.log"))))
    # Neither made nor loaded again: the twin verify loaded and ran stayed loaded for it.
    [shared] = [log.read_text() for log in logs.glob("worker-*.log") if "--- stage verify" in log.read_text()]
    assert "[verify] the CPU twin stays loaded for report" in shared
    assert "[report] HLO from the CPU twin verify loaded and ran" in shared
    lock = yaml.safe_load((ws / "recipes" / "placed.lock.yaml").read_text())
    index = [s["stage"] for s in lock["stages"]].index("report")
    handed_on = lock["stages"][index]["output"]

    # Its record removed, report runs again; verify is cached, so nothing is handed on:
    # a fresh worker makes its own twin.
    lock_record(ws, "placed", index).unlink()
    before = set(logs.glob("worker-*.log"))
    again = build_json(ws, env=own)
    assert (statuses(again, "placed")["verify"], statuses(again, "placed")["report"]) == ("cached", "built")
    [fresh] = [log for log in logs.glob("worker-*.log") if log not in before]
    assert _stages_per_worker([fresh]) == [["report"]]
    assert "HLO from the CPU twin verify loaded" not in fresh.read_text()
    lock = yaml.safe_load((ws / "recipes" / "placed.lock.yaml").read_text())
    assert lock["stages"][index]["output"] == handed_on


def test_a_kept_twin_is_the_twin_make_cpu_twin_writes_and_follows_its_input(tmp_path, tpu_saved_model,
                                                                             monkeypatch):
    import shutil

    from tpubuild.handoff import WORKER_SCRATCH
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.functions import resolve_tpu_functions
    from tpubuild.tpu.placement import place_on_tpu
    from tpubuild.tpu.twin import cpu_twin, make_cpu_twin

    model = SavedModel.load(tpu_saved_model)
    place_on_tpu(model, resolve_tpu_functions(model, [{"function_alias": "tpu_func"}]))
    placed = tmp_path / "placed"
    placed.mkdir()
    model.save(placed)
    alone = tmp_path / "alone"
    make_cpu_twin(placed, alone, ["serve"])

    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv(WORKER_SCRATCH, str(tmp_path / "scratch"))
    kept = cpu_twin(placed, ["serve"], tmp_path / "unused")
    assert cpu_twin(placed, ["serve"], tmp_path / "unused") == kept  # made once
    assert (kept / "saved_model.pb").read_bytes() == (alone / "saved_model.pb").read_bytes()
    assert kept.is_relative_to(tmp_path / "scratch") and not (tmp_path / "unused").exists()
    # Another directory, or the same one with a file written again: another twin.
    copy = tmp_path / "copy"
    shutil.copytree(placed, copy)
    assert cpu_twin(copy, ["serve"], tmp_path / "unused") != kept
    pb = placed / "saved_model.pb"
    data = pb.read_bytes()
    pb.unlink()
    pb.write_bytes(data)
    assert cpu_twin(placed, ["serve"], tmp_path / "unused") != kept


def test_what_a_stage_hands_on_is_kept_only_when_its_worker_is_handed_on_and_taken_once():
    from tpubuild import handoff as workers

    # In-process, or a stage whose worker is not handed on (no `keep_for`): nothing kept.
    assert workers.hand_on("twin", object()) is False and workers.handed_on("twin") is None
    workers.begin_stage(True)  # what main() does for a `keep_for` request
    try:
        kept = object()
        assert workers.hand_on("twin", kept) is True
        assert workers.handed_on("twin") is kept and workers.handed_on("twin") is None
        # Kept and not taken by a stage that is not handed on: let go when it ends.
        assert workers.hand_on("twin", object()) is True
        workers.end_stage()
        assert workers.handed_on("twin") is not None  # this stage was handed on: still there
        workers.hand_on("twin", kept)
        workers.begin_stage(False)
        workers.end_stage()
        assert workers.handed_on("twin") is None
    finally:
        workers.begin_stage(False)
        workers.end_stage()


@pytest.mark.slow
def test_a_verify_not_handed_on_keeps_no_twin(tmp_path, tpu_saved_model):
    """A small model's verify shares the pool's workers and is not handed on to report
    (engine/loop.py: HANDOFF applies from OWN_WORKER_MIN_BYTES on): its twin is let go with
    the stage (tpu/twin.py keep_loaded), and report loads its own."""
    ws = write_workspace(tmp_path / "ws", tpu_saved_model, {"placed": RECIPE})
    done = build_json(ws, env={"TPUBUILD_OWN_WORKER_MIN_BYTES": str(2**40)})
    assert statuses(done, "placed")["report"] == "built", done
    logs = [log.read_text() for log in (ws / ".tpubuild" / "logs").glob("worker-*.log")]
    assert any("--- stage verify" in text for text in logs) and any("--- stage report" in text for text in logs)
    assert not any("stays loaded for report" in text or "HLO from the CPU twin verify" in text for text in logs)


@pytest.mark.slow  # a cold build: the slow tier
def test_a_batched_recipe_runs_warmup_before_verify_and_hands_verifys_worker_to_report(tmp_path, tpu_saved_model):
    """warmup (when a recipe batches) runs no model: it runs in the transforms' worker, before
    verify, and hands it on to verify (pipeline.py MAIN_STAGES); report then takes the twin
    verify loaded, in no new worker (engine/loop.py HANDOFF), with nothing run between."""
    batched = RECIPE.replace("converter:\n", "converter:\n  batch_options:\n    - {num_batch_threads: 1, "
                             "max_batch_size: 4, batch_timeout_micros: 0, allowed_batch_sizes: [2, 4], "
                             "max_enqueued_batches: 10}\n")
    ws = write_workspace(tmp_path / "ws", tpu_saved_model, {"placed": batched})
    done = build_json(ws, env={"TPUBUILD_OWN_WORKER_MIN_BYTES": "1"})
    assert [statuses(done, "placed")[s] for s in ("verify", "warmup", "report")] == ["built"] * 3, done
    logs = list((ws / ".tpubuild" / "logs").glob("worker-*.log"))
    assert any(stages[-4:] == ["batch", "warmup", "verify", "report"] for stages in _stages_per_worker(logs))
    [shared] = [log.read_text() for log in logs if "--- stage verify" in log.read_text()]
    assert "[verify] verify called the artifact in batches of 2, 4 rows" in shared
    assert "[report] HLO from the CPU twin verify loaded and ran" in shared
