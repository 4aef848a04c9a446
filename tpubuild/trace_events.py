"""The build as a timeline: Chrome's Trace Event Format, which Perfetto's UI and
chrome://tracing read (`tpubuild build --profile FILE`; Bazel's `--profile` writes the same
format, having dropped its own HTML profile for it).

The format (the "Trace Event Format" document of the Catapult project, the one both viewers
implement): a JSON object whose `traceEvents` list holds complete events (`ph: "X"`, with
`name`, `cat`, `ts` and `dur` in microseconds, `pid`, `tid`, `args`) and metadata events
(`ph: "M"`: `process_name`, `thread_name`, their sort indexes) that name the tracks. Events
on one track must nest (a child inside its parent, never straddling its end): Perfetto
flags the rest as misnested. Each track here is one thread of work, and every event on it
is a `with` block of that thread or a span the engine measured of one worker, so they nest.

Tracks:
- the main process (pid MAIN_PID): one track per thread (doit's stage threads, the upload
  threads), holding the process's own work (planning and keys, hashing, copies into the
  cache, publishing, lock files) and its waits;
- this machine's workers (pid WORKERS_PID): one track per worker process (`worker-N`, its
  log's name), holding each stage it ran and the start-up its stage waited for;
- each Ray node (pid RAY_PID + n): one track per Ray worker process.

Recording costs nothing when no trace is active (one global read): the build's modules
call `span`, `waiting` and `complete` whether or not `--profile` was given.

A wait is one kind in WAITS and a `with waiting(kind):` around it; a new kind of wait (the
pool's waiting for memory) is one line here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

# What the build waits for, by kind: the name of its event. Add a kind here and wrap its
# wait in `with waiting(kind):`.
WAITS = {
    "worker": "waiting for a worker",
    "cache_lock": "waiting for the cache lock",
    "workspace_lock": "waiting for the workspace lock",
    "memory": "waiting for memory",
    "ray": "waiting for a Ray node",
}
# A wait shorter than this is not recorded: a lock taken at once is no wait.
MIN_WAIT_SECONDS = 0.001

MAIN_PID = 1
WORKERS_PID = 2
RAY_PID = 10  # the first Ray node's; each further node is the next number

Where = tuple[int, int]  # (pid, tid)


class Trace:
    """The events of one command, collected from every thread; `document()` is the JSON."""

    def __init__(self, label: str = "tpubuild"):
        self.origin = time.monotonic()
        self.wall = time.time()
        self.label = label
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.processes: dict[int, str] = {MAIN_PID: f"{label} (pid {os.getpid()})", WORKERS_PID: "workers"}
        self.threads: dict[Where, str] = {}
        self._thread_tids: dict[int, int] = {}  # threading ident -> tid
        self._tracks: dict[tuple[int, str], int] = {}  # (pid, label) -> tid
        self._nodes: dict[str, int] = {}  # Ray host -> pid
        self._ends: dict[Where, float] = {}  # track -> the latest end of its events

    def micros(self, t: float) -> float:
        """A time.monotonic() reading as microseconds since the trace began."""
        return round((t - self.origin) * 1e6, 1)

    def here(self) -> Where:
        """The track of the calling thread in the main process."""
        ident = threading.get_ident()
        with self.lock:
            tid = self._thread_tids.get(ident)
            if tid is None:
                tid = self._thread_tids[ident] = len(self._thread_tids) + 1
                self.threads[(MAIN_PID, tid)] = threading.current_thread().name
            return MAIN_PID, tid

    def track(self, pid: int, label: str, tid: int | None = None) -> Where:
        """The track named `label` of process `pid` (tid `tid` when given, else the next)."""
        with self.lock:
            known = self._tracks.get((pid, label))
            if known is None:
                used = {t for p, t in self.threads if p == pid}
                known = tid if tid is not None and tid not in used else max(used, default=0) + 1
                self._tracks[(pid, label)] = known
                self.threads[(pid, known)] = label
            return pid, known

    def node(self, host: str) -> int:
        """The pid of Ray node `host`."""
        with self.lock:
            pid = self._nodes.get(host)
            if pid is None:
                pid = self._nodes[host] = RAY_PID + len(self._nodes)
                self.processes[pid] = f"ray node {host}"
            return pid

    def complete(self, name: str, cat: str, start: float, end: float, where: Where | None = None,
                 args: dict[str, Any] | None = None) -> None:
        """A complete event from `start` to `end` (time.monotonic() readings) on `where`
        (default: the calling thread's track)."""
        pid, tid = where if where is not None else self.here()
        # The end rounded as the start is: a child that ends with its parent still ends inside it.
        ts, until = self.micros(start), self.micros(max(start, end))
        event = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": round(until - ts, 1), "pid": pid, "tid": tid,
                 "args": {k: v for k, v in (args or {}).items() if v is not None}}
        with self.lock:
            self.events.append(event)
            self._ends[(pid, tid)] = max(self._ends.get((pid, tid), start), end)

    def free_from(self, where: Where) -> float:
        """When the last event recorded on `where` ended (time.monotonic()), else the origin:
        an event measured after the fact starts no earlier, so a worker's track never holds
        two events at once."""
        with self.lock:
            return self._ends.get(where, self.origin)

    def document(self) -> dict[str, Any]:
        with self.lock:
            events = sorted(self.events, key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
            meta: list[dict[str, Any]] = []
            for pid, name in sorted(self.processes.items()):
                if pid in (MAIN_PID, WORKERS_PID) or any(p == pid for p, _ in self.threads):
                    meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
                    meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                                 "args": {"sort_index": pid}})
            for (pid, tid), name in sorted(self.threads.items()):
                meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
                meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                             "args": {"sort_index": tid}})
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"tool": self.label,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall))}}

    def write(self, path: Path) -> None:
        """The document, written atomically: a reader (or a build killed meanwhile) sees
        the old file or the whole new one, never half of it."""
        from tpubuild.atomic import write_atomic

        write_atomic(Path(path), (json.dumps(self.document(), separators=(",", ":")) + "\n").encode())


_active: Trace | None = None
_context = threading.local()  # the args every event of this thread carries: recipe, stage


def start(label: str = "tpubuild") -> Trace:
    """Begin recording this process's events (build --profile)."""
    global _active
    _active = Trace(label)
    return _active


def stop() -> Trace | None:
    global _active
    trace, _active = _active, None
    return trace


def active() -> Trace | None:
    return _active


def _with_context(args: dict[str, Any]) -> dict[str, Any]:
    return {**getattr(_context, "args", {}), **args}


@contextmanager
def about(**args: Any) -> Iterator[None]:
    """Every event this thread records inside the block carries `args` (recipe, stage)."""
    before = getattr(_context, "args", {})
    _context.args = {**before, **args}
    try:
        yield
    finally:
        _context.args = before


@contextmanager
def _timed(name: str, cat: str, args: dict[str, Any], shortest: float = 0.0) -> Iterator[None]:
    """The block as an event on the calling thread's track, unless shorter than `shortest`."""
    trace = _active
    if trace is None:
        yield
        return
    start_time = time.monotonic()
    try:
        yield
    finally:
        end = time.monotonic()
        if end - start_time >= shortest:
            trace.complete(name, cat, start_time, end, args=_with_context(args))


def span(name: str, cat: str = "work", **args: Any) -> AbstractContextManager[None]:
    """The main process's own work inside the block, on the calling thread's track."""
    return _timed(name, cat, args)


def waiting(kind: str, **args: Any) -> AbstractContextManager[None]:
    """A wait of kind `kind` (WAITS) inside the block; not recorded when it took no time."""
    return _timed(WAITS[kind], "wait", {"wait": kind, **args}, MIN_WAIT_SECONDS)


def complete(name: str, cat: str, start_time: float, end: float, where: Where | None = None, **args: Any) -> None:
    """An event measured after the fact (a worker's stage, from its reply)."""
    trace = _active
    if trace is not None:
        trace.complete(name, cat, start_time, end, where, args if where is not None else _with_context(args))


def free_from(where: Where, earliest: float) -> float:
    """`earliest`, or later when the track `where` is busy until then (Trace.free_from)."""
    trace = _active
    return earliest if trace is None else max(earliest, trace.free_from(where))


def worker_track(log_path: str | None) -> Where | None:
    """The track of the local worker whose log is `log_path` (`.../worker-7.log`: tid 8;
    tid 0 is the process's own in the viewers)."""
    trace = _active
    if trace is None or not log_path:
        return None
    label = Path(log_path).stem
    number = label.rpartition("-")[2]
    return trace.track(WORKERS_PID, label, int(number) + 1 if number.isdigit() else None)


def ray_track(host: str, worker: str) -> Where | None:
    """The track of Ray worker process `worker` on node `host`."""
    trace = _active
    if trace is None:
        return None
    return trace.track(trace.node(host), worker)
