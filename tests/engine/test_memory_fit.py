"""Builds that fit the machine (issue 54 items 3 and 5): the local pool (`-j N`) starts a
stage only while the memory estimates of what runs fit the memory available
(TPUBUILD_MEMORY_AVAILABLE stands for it here), a stage whose own estimate exceeds the
machine says so in one line and runs anyway, and each stage's measured peak memory reaches
the lock file and `tpubuild report`. Real builds of the tiny model, the real CLI; which
stages ran at once is read from the build's own trace (`build --profile`)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import build_json, export_recipe
from tests.trace_rules import complete_events, read_trace
from tpubuild.lock import MEASURED, read_lock
from tpubuild.report.formats import human_bytes
from tpubuild.stages.base import RUNS_USER_CODE, TF_BASELINE

GiB = 2**30
# An export (user code: estimated as a load of UNKNOWN_MODEL, stages/base.py) that copies
# the prebuilt SavedModel and holds the stage long enough that two at once overlap.
SLOW_EXPORT = textwrap.dedent(
    '''\
    # {name}
    import shutil
    import time
    from pathlib import Path

    import notes


    def export(output_dir):
        time.sleep(1.5)
        shutil.copytree(Path(__file__).parent / "prebuilt", output_dir, dirs_exist_ok=True)
    '''
)
EXPORT_ESTIMATE = RUNS_USER_CODE.bytes(None)


def two_exports(make_workspace):
    ws = make_workspace({name: export_recipe(name, f"models/{name}_export.py", "models/notes.py")
                         for name in ("first", "second")})
    for name in ("first", "second"):  # two scripts: two keys, both stages run
        (ws / "recipes" / "models" / f"{name}_export.py").write_text(SLOW_EXPORT.format(name=name))
    return ws


def export_spans(trace) -> dict[str, tuple[float, float]]:
    return {e["args"]["recipe"]: (e["ts"], e["ts"] + e["dur"]) for e in complete_events(read_trace(trace), "stage")
            if e["args"]["stage"] == "export"}


def overlap(spans: dict[str, tuple[float, float]]) -> float:
    (a0, a1), (b0, b1) = spans["first"], spans["second"]
    return min(a1, b1) - max(a0, b0)  # > 0: both ran at once (microseconds)


@pytest.mark.slow  # ~25 s: two recipes' builds, then a no-op one
def test_two_stages_that_do_not_fit_together_run_one_after_the_other(make_workspace, tmp_path):
    available = int(1.5 * EXPORT_ESTIMATE)  # one fits, two do not
    ws = two_exports(make_workspace)
    trace = tmp_path / "trace.json"
    result = tpubuild(ws, "build", "--json", "-j", "2", "--profile", str(trace),
                      env={"TPUBUILD_MEMORY_AVAILABLE": str(available)}, code=0)
    document = json.loads(result.stdout)
    # Both built: each its export, each published (the second's verify and report are the
    # first's, cached: the two exports copy the same model).
    assert {(r["recipe"], r["stage"]) for r in document["rows"] if r["status"] == "built"} >= \
        {(name, stage) for name in ("first", "second") for stage in ("export", "publish")}
    assert "exceeds this machine's memory" not in result.stderr
    spans = export_spans(trace)
    assert overlap(spans) <= 0, spans
    # The second waited for memory: the trace says so.
    waits = [e for e in complete_events(read_trace(trace), "wait") if e["name"] == "waiting for memory"]
    assert any(e["dur"] >= 1e6 for e in waits), waits  # most of the first's 1.5 s sleep

    # Each worker stage's measured peak is in the lock file, on a line marked measured (the
    # figure of the build that made it, cached or not), and the build's (the largest);
    # `tpubuild report --json` and its text say the same.
    lock = (ws / "recipes" / "first.lock.yaml").read_text()
    measured = {(r["stage"], r["key"]): r["peak_rss_bytes"] for r in document["rows"] if r["peak_rss_bytes"]}
    recorded = read_lock(ws / "recipes" / "first.lock.yaml")
    peaks = {s["stage"]: s["peak_memory"] for s in recorded["stages"] if "peak_memory" in s}
    assert set(peaks) == {"export", "verify", "report"}, lock
    for s in recorded["stages"]:
        if s["stage"] in peaks:
            assert peaks[s["stage"]] == measured[(s["stage"], s["key"])] > TF_BASELINE / 2
            assert f"  peak_memory: {peaks[s['stage']]}  {MEASURED}\n" in lock
    assert f"  peak_memory_bytes: {max(peaks.values())}  {MEASURED}\n" in lock
    report = json.loads(tpubuild(ws, "report", "first", "--format", "json", code=0).stdout)
    assert report["peak_memory"]["stages"] == peaks
    assert report["peak_memory"]["build"] == max(peaks.values())
    text = tpubuild(ws, "report", "first", code=0).stdout
    assert "peak memory (measured on the building machine): build " in text
    # A no-op rebuild keeps the lock file byte for byte: a cached stage keeps its build's figure.
    again = build_json(ws, "-j", "2")
    assert {row["status"] for row in again["rows"]} == {"cached"}
    assert (ws / "recipes" / "first.lock.yaml").read_text() == lock


@pytest.mark.slow  # ~20 s
def test_with_memory_for_both_they_run_at_once(make_workspace, tmp_path):
    ws = two_exports(make_workspace)
    trace = tmp_path / "trace.json"
    tpubuild(ws, "build", "-j", "2", "--profile", str(trace),
             env={"TPUBUILD_MEMORY_AVAILABLE": str(4 * EXPORT_ESTIMATE)}, code=0)
    spans = export_spans(trace)
    assert overlap(spans) > 0.5e6, spans  # most of the 1.5 s sleeps, together


@pytest.mark.slow  # ~25 s: two builds
def test_a_stage_over_the_machine_says_so_in_one_line_and_runs(make_workspace):
    ws = make_workspace({"big": export_recipe("big", "models/copy_export.py", "models/notes.py")})
    machine = GiB  # above every other stage's estimate of the tiny model, below the export's
    assert TF_BASELINE < machine < EXPORT_ESTIMATE
    result = tpubuild(ws, "build", env={"TPUBUILD_MEMORY_AVAILABLE": str(machine)}, code=0)
    lines = [line for line in result.stderr.splitlines() if "memory" in line]
    assert lines == [f"recipes/big.yaml: stage export: warning: its memory estimate {human_bytes(EXPORT_ESTIMATE)} "
                     "exceeds this machine's memory (1.0 GiB); it runs anyway, when no other stage runs"], result.stderr
    assert "published: big -> out/big/1" in result.stdout
    # Once it made a model, the export is estimated by that model's size (the tiny one's): no warning.
    script = ws / "recipes" / "models" / "copy_export.py"
    script.write_text(script.read_text() + "# edited\n")
    again = tpubuild(ws, "build", env={"TPUBUILD_MEMORY_AVAILABLE": str(machine)}, code=0)
    assert "export: built" in again.stdout and "memory" not in again.stderr, again.stderr


def test_the_live_line_says_a_stage_waits_for_memory():
    """On a terminal, a stage the pool holds back says so on the live line until it starts."""
    import io
    from types import SimpleNamespace

    from tpubuild.commands.build_output import NORMAL, BuildOutput

    out = io.StringIO()
    printer = BuildOutput(out, NORMAL, tty=True, colour=False, display=str)
    printer.total = 4
    run = SimpleNamespace(name="big")
    printer.started(run, "verify")
    printer.waiting(run, "verify", True)
    printer._draw()
    assert out.getvalue().endswith("[0/4] running big: verify waiting for memory 0 s")
    printer.waiting(run, "verify", False)
    printer._draw()
    assert out.getvalue().endswith("[0/4] running big: verify 0 s")


def test_the_gate_starts_a_stage_only_while_the_estimates_fit(monkeypatch):
    """workers/pool.py MemoryGate with TPUBUILD_MEMORY_AVAILABLE: a stage that does not fit
    beside the running one waits (and is told so) until it leaves; with nothing running,
    any stage starts, however large."""
    import threading

    from tpubuild.workers.pool import MemoryGate

    monkeypatch.setenv("TPUBUILD_MEMORY_AVAILABLE", str(10 * GiB))
    gate = MemoryGate()
    first = gate.enter(6 * GiB)
    told: list[bool] = []
    entered = threading.Event()

    def second() -> None:
        gate.leave(gate.enter(6 * GiB, told.append))
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not entered.wait(1.0) and told == [True]  # 6 + 6 GiB > 10 GiB: it waits
    small = gate.enter(3 * GiB)  # 6 + 3 fits beside the first
    gate.leave(small)
    gate.leave(first)
    assert entered.wait(5.0) and told == [True, False]
    thread.join()
    gate.leave(gate.enter(100 * GiB))  # nothing runs: it starts


def test_without_the_knob_free_memory_is_mem_available_less_what_running_stages_will_still_take(monkeypatch):
    """A running stage's estimate counts less what its worker already holds (MemAvailable
    has counted that); a stage larger than the machine waits while another runs."""
    import os

    from tpubuild.memory import available_memory_bytes, process_rss_bytes, total_memory_bytes
    from tpubuild.workers.pool import MemoryGate

    monkeypatch.delenv("TPUBUILD_MEMORY_AVAILABLE", raising=False)
    gate = MemoryGate()
    ballast = b"\1" * GiB  # this process, standing for a stage's worker, holds 1 GiB of it already
    held = process_rss_bytes(os.getpid())
    assert held and held > GiB
    running = gate.enter(held + 2 * GiB)
    gate.started(running, os.getpid())
    before = available_memory_bytes()
    free = gate.free()
    after = available_memory_bytes()
    assert before and after and free is not None
    # 2 GiB still to come, not all of held + 2 GiB (0.5 GiB of slack: others on a shared machine).
    assert max(before, after) - 2.5 * GiB < free < min(before, after) - 1.5 * GiB, (before, free, after, held)
    del ballast
    told: list[bool] = []
    import threading

    waiter = threading.Thread(target=lambda: gate.leave(gate.enter(4 * (total_memory_bytes() or 0), told.append)))
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive() and told == [True]
    gate.leave(running)
    waiter.join(5.0)
    assert not waiter.is_alive() and told == [True, False]
