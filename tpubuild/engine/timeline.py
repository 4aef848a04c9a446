"""What the build loop tells the trace (`build --profile`, tpubuild/trace_events.py).

- Each task's up-to-date test (its key, its inputs hashed, the cache lookup) is the main
  process's planning work, on the track of the doit thread that ran it, with the verdict
  (`cached`, or `to build`) and the key.
- A stage a worker ran is one event on that worker's track (or the Ray node's), with the
  recipe, stage, verdict and key; before it on the same track, the worker's start-up that
  the stage waited for, and on the doit thread's track the wait for that worker.
- An engine step (the source's snapshot into the cache, publishing) is one event on the
  doit thread's track: it runs in this process.

Nothing here changes what the build does: with no trace active every call returns at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tpubuild import trace_events
from tpubuild.pipeline import ENGINE_STEPS

if TYPE_CHECKING:
    from tpubuild.engine.resolver import RecipeRun
    from tpubuild.pipeline import PlannedStage

# A wait for a worker shorter than this (a reused worker's pipe and JSON) is not drawn.
MIN_STARTUP_SECONDS = 0.005


def traced_planning(up_to_date: Callable[[Any, RecipeRun], bool], engine: Any, run: RecipeRun) -> bool:
    """`up_to_date(engine, run)` (engine/lockdoc.py: is the whole recipe cached, published and
    locked?), recorded as planning work: when it is, with each stage's key."""
    if trace_events.active() is None:
        return up_to_date(engine, run)
    start = time.monotonic()
    current = False
    try:
        current = up_to_date(engine, run)
        return current
    finally:
        trace_events.complete(f"{run.name}: planning (is it up to date?)", "plan", start, time.monotonic(),
                              recipe=run.name, verdict="up to date" if current else "to build",
                              stages={row.stage: row.key for row in run.rows} if current else None)


def traced_uptodate(engine: Any, run: RecipeRun, planned: PlannedStage) -> bool:
    """engine.uptodate, recorded as planning work with its verdict and key."""
    return _traced(engine.uptodate, run, planned, _looked_up)


def traced_action(engine: Any, run: RecipeRun, planned: PlannedStage) -> bool:
    """engine.action; an engine step (source, publish) is a stage event of this thread."""
    return _traced(engine.action, run, planned, _acted, engine)


def _traced(call: Callable[[RecipeRun, PlannedStage], bool], run: RecipeRun, planned: PlannedStage,
            then: Callable[..., None], *extra: Any) -> bool:
    """`call(run, planned)` with the recipe and stage in every event it records, then
    `then(run, planned, ok, start, row, *extra)` (row: the stage's last, or None)."""
    if trace_events.active() is None:
        return call(run, planned)
    start = time.monotonic()
    with trace_events.about(recipe=run.name, stage=planned.name):
        ok = False
        try:
            ok = call(run, planned)
            return ok
        finally:
            rows = [row for row in run.rows if row.stage == planned.name]
            then(run, planned, ok, start, rows[-1] if rows else None, *extra)


def _looked_up(run: RecipeRun, planned: PlannedStage, cached: bool, start: float, row: Any,
               engine: Any = None) -> None:
    out = run.outputs.get(planned.name)
    key = out.key if cached and out is not None else None
    verdict = row.status if row is not None else ("cached" if cached else "to build")
    trace_events.complete(f"{run.name}: {planned.name}: key and cache lookup", "plan", start, time.monotonic(),
                          verdict=verdict, key=key, remote=True if row is not None and row.remote else None)


def _acted(run: RecipeRun, planned: PlannedStage, ok: bool, start: float, row: Any, engine: Any = None) -> None:
    _flush_worker_event(row)
    if planned.name in ENGINE_STEPS:
        out = run.outputs.get(planned.name)
        verdict = row.status if row is not None else ("built" if ok else "failed")
        trace_events.complete(f"{run.name}: {planned.name}", "stage", start, time.monotonic(),
                              verdict=verdict, key=out.key if out is not None else None, runs_in="main process")


def worker_ran(recipe: str, stage: str, key: str, reply: dict[str, Any], asked: float, replied: float) -> None:
    """A stage a worker (local, or on a Ray node) ran: asked at `asked`, its reply at
    `replied` (time.monotonic()). The reply's `seconds` is the stage's own work, timed in
    the worker (workers/process.py); the rest of the wait was the worker's start-up (a new
    process, TensorFlow's import), or on Ray the task's scheduling and transfers."""
    if trace_events.active() is None:
        return
    own = reply.get("seconds")
    own = min(float(own), replied - asked) if isinstance(own, (int, float)) else replied - asked
    began = replied - own
    verdict = "built" if reply.get("ok") else "failed"
    node = reply.get("node")  # workers/ray.py: where the task ran and its phases
    if isinstance(node, dict):
        where = trace_events.ray_track(str(node.get("host")), f"ray worker {node.get('pid')}")
        label: str | None = f"ray node {node.get('host')}"
        # The node's phases, from its own clock, end when its result arrived here: its
        # upload, the stage before it, its fetch before that. Then this process fetched
        # the outputs (until `replied`).
        received = float(node.get("received") or replied)
        upload = float(node.get("upload_seconds") or 0.0)
        fetch = float(node.get("fetch_seconds") or 0.0)
        floor = trace_events.free_from(where, asked) if where is not None else asked
        own = min(own, max(0.0, received - floor - upload))
        began = max(floor, received - upload - own)
        if fetch > 0:
            trace_events.complete(f"{recipe}: {stage}: inputs from the remote cache", "transfer",
                                  max(floor, began - fetch), began, where, recipe=recipe, stage=stage)
        if upload > 0:
            trace_events.complete(f"{recipe}: {stage}: outputs to the remote cache", "transfer",
                                  received - upload, received, where, recipe=recipe, stage=stage)
        if replied - received >= MIN_STARTUP_SECONDS:
            trace_events.complete(f"{recipe}: {stage}: outputs from the remote cache", "transfer", received, replied)
        wait_kind = "ray"
    else:
        where = trace_events.worker_track(reply.get("log"))
        if where is not None:  # the worker's track may end a moment after this stage was asked
            began = trace_events.free_from(where, began)
            own = replied - began
        label = Path(str(reply.get("log"))).stem if reply.get("log") else None  # worker-N
        wait_kind = "worker"
    if began - asked >= MIN_STARTUP_SECONDS:
        trace_events.complete(trace_events.WAITS[wait_kind], "wait", asked, began, wait=wait_kind, worker=label)
    if where is not None and wait_kind == "worker":
        free = trace_events.free_from(where, asked)
        if began - free >= MIN_STARTUP_SECONDS:
            trace_events.complete("start-up (a new process, TensorFlow's import)", "startup", free, began, where,
                                  recipe=recipe, stage=stage)
    # The stage's own event waits for its row (traced_action): the key a user-code stage
    # ends with covers the imports it discovered, and a stage whose inputs changed while it
    # ran fails after its worker replied.
    _flush_worker_event()
    _worker_event.pending = (f"{recipe}: {stage}", began, began + own, where,
                             {"recipe": recipe, "stage": stage, "verdict": verdict, "key": key, "worker": label,
                              "peak_rss_bytes": reply.get("peak_rss_bytes"),
                              # On Ray: what the task was granted (its memory= reservation among them).
                              **({"ray_resources": node.get("resources")} if isinstance(node, dict) else {}),
                              "error": None if reply.get("ok") else reply.get("error")})


_worker_event = threading.local()  # the stage event worker_ran measured, until its row


def _flush_worker_event(row: Any = None) -> None:
    pending = getattr(_worker_event, "pending", None)
    _worker_event.pending = None
    if pending is None:
        return
    name, began, end, where, args = pending
    if row is not None:
        args = {**args, "verdict": row.status, "key": row.key or args["key"]}
    trace_events.complete(name, "stage", began, end, where, **args)
