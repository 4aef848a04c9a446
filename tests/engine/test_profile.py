"""`tpubuild build --profile FILE` (issue 56 item 2): the build as a Chrome trace, checked
against the Trace Event Format's rules (tests/trace_rules.py); real builds, the real CLI."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import build_json, export_recipe, source_recipe
from tests.trace_rules import complete_events, problems, process_names, read_trace, track_names
from tpubuild.pipeline import ENGINE_STEPS


def stage_events(document: dict) -> dict[tuple[str, str], dict]:
    found: dict[tuple[str, str], dict] = {}
    for event in complete_events(document, "stage"):
        key = (event["args"]["recipe"], event["args"]["stage"])
        assert key not in found, f"two events for {key}"
        found[key] = event
    return found


def test_a_build_is_a_trace_with_each_stage_on_the_track_of_its_worker(make_workspace, tmp_path):
    ws = make_workspace({"toy": source_recipe("toy"),
                         "cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    trace = tmp_path / "trace.json"
    document = build_json(ws, "-j", "2", "--profile", str(trace))
    events = read_trace(trace)
    names, processes = track_names(events), process_names(events)
    assert processes[1].startswith("tpubuild build (pid ") and processes[2] == "workers"
    stages = stage_events(events)
    built = [row for row in document["rows"] if row["status"] == "built"]
    assert built and {(r["recipe"], r["stage"]) for r in built} == set(stages)
    for row in built:
        event = stages[(row["recipe"], row["stage"])]
        assert {k: event["args"][k] for k in ("recipe", "stage", "verdict", "key")} == \
            {"recipe": row["recipe"], "stage": row["stage"], "verdict": "built", "key": row["key"]}
        track = names[(event["pid"], event["tid"])]
        if row["stage"] in ENGINE_STEPS:  # the source's snapshot and publish run in this process
            assert event["pid"] == 1, event
        else:
            assert event["pid"] == 2 and track == event["args"]["worker"] and track.startswith("worker-"), event
    # -j 2: the two recipes' stages ran on two workers at once.
    assert len({(e["pid"], e["tid"]) for e in stages.values() if e["pid"] == 2}) >= 2
    # The main process's own work and its waits, each its own event.
    plan = complete_events(events, "plan")
    looked_up = {(e["args"]["recipe"], e["args"]["stage"]) for e in plan if "stage" in e["args"]}
    assert looked_up == {(r["recipe"], r["stage"]) for r in document["rows"]}
    assert any(e["name"] == "toy: planning (is it up to date?)" for e in plan)
    assert any(e["name"] == "copying into the cache" and e["args"]["recipe"] == "toy"
               for e in complete_events(events, "cache"))
    assert {e["name"] for e in complete_events(events, "work")} >= {"toy: lock file", "cut: lock file"}
    waits = complete_events(events, "wait")
    assert any(e["name"] == "waiting for a worker" and e["pid"] == 1 for e in waits)
    startups = complete_events(events, "startup")
    assert startups and all(e["pid"] == 2 for e in startups)


def test_a_build_with_nothing_to_do_is_a_trace_of_lookups(make_workspace, tmp_path):
    ws = make_workspace({"toy": source_recipe("toy")})
    build_json(ws)
    trace = tmp_path / "noop.json"
    document = build_json(ws, "--profile", str(trace))  # the full path, not the memo's shortcut
    events = read_trace(trace)
    assert stage_events(events) == {}
    planning = [e for e in complete_events(events, "plan") if e["name"] == "toy: planning (is it up to date?)"]
    assert [e["args"]["verdict"] for e in planning] == ["up to date"]
    assert planning[0]["args"]["stages"] == {row["stage"]: row["key"] for row in document["rows"]}


def _hold(path: Path, seconds: float, taken: threading.Event) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken.set()
        time.sleep(seconds)
    finally:
        os.close(fd)


def test_waits_for_the_workspace_and_cache_locks_are_events(make_workspace, tmp_path):
    ws = make_workspace({"toy": source_recipe("toy")})
    build_json(ws)
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=3))  # work to do: the cache is opened
    holders = []
    # The cache lock longer: the build asks for it only once it has the workspace lock.
    for lock, seconds in ((ws / ".tpubuild" / "build.lock", 1.0), (ws / ".tpubuild" / "cache" / "v1" / "lock", 2.5)):
        taken = threading.Event()
        holder = threading.Thread(target=_hold, args=(lock, seconds, taken))
        holder.start()
        assert taken.wait(10)
        holders.append(holder)
    trace = tmp_path / "trace.json"
    try:
        tpubuild(ws, "build", "--profile", str(trace), code=0)
    finally:
        for holder in holders:
            holder.join()
    waits = {e["args"]["wait"]: e for e in complete_events(read_trace(trace), "wait")}
    assert waits["workspace_lock"]["name"] == "waiting for the workspace lock"
    assert waits["workspace_lock"]["dur"] > 0.3e6  # both were held for 1 s from before the build
    assert waits["cache_lock"]["name"] == "waiting for the cache lock"


def _build_held_in_export(ws: Path, trace: Path) -> subprocess.Popen:
    """`build --profile` of the recipe whose export waits while recipes/models/SLOW exists,
    returned once the export runs in its worker."""
    (ws / "recipes" / "models" / "SLOW").write_text("")
    proc = subprocess.Popen([*CLI, "build", "--profile", str(trace)], cwd=ws, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = list((ws / ".tpubuild" / "logs").glob("worker-*.log")) if (ws / ".tpubuild" / "logs").is_dir() else []
        if any("--- stage export" in log.read_text(errors="replace") for log in logs):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the export never started")


def test_an_interrupted_build_writes_a_valid_trace_and_a_killed_one_leaves_the_old(make_workspace, tmp_path):
    ws = make_workspace({"cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    trace = tmp_path / "trace.json"
    proc = _build_held_in_export(ws, trace)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=60)
    assert proc.returncode != 0
    events = read_trace(trace)
    assert any(e["name"] == "cut: export: key and cache lookup" for e in complete_events(events, "plan"))
    before = trace.read_bytes()
    proc = _build_held_in_export(ws, trace)
    proc.kill()  # SIGKILL: no chance to write anything
    proc.wait(timeout=60)
    assert trace.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "ws") == ["trace.json"]  # no temp file left


def test_the_trace_rules_catch_what_perfetto_would_drop():
    """The checker itself: a straddling event, a missing duration, an unnamed track."""
    meta = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "t"}}]

    def event(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"name": name, "cat": "x", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": {}}

    assert problems({"traceEvents": meta + [event("a", 0, 10), event("b", 2, 3), event("c", 10, 1)]}) == []
    assert problems({"traceEvents": meta + [event("a", 0, 10), event("b", 5, 10)]}) == [
        "track 1/1: 'b' [5, 15] straddles the end of 'a' (10)"]
    assert problems({"traceEvents": meta + [{**event("a", 0, 1), "dur": None}]}) == [
        "event 2 ('a'): dur must be a number >= 0"]
    assert problems({"traceEvents": meta + [event("a", 0, 1, tid=2)]}) == ["track 1/2: no thread_name"]
    assert problems([]) == ["not an object with a traceEvents list"]
    assert json.loads(json.dumps(meta))  # the events are JSON as written
