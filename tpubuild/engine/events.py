"""What a build tells its caller while it runs: a `Row` per stage outcome, and the
`BuildEvents` it is told through (the CLI's live output, commands/build_output.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from tpubuild.engine.resolver import RecipeRun

__all__ = ["BuildEvents", "Row", "WorkerTime"]


@dataclass
class Row:
    recipe: str
    stage: str
    status: str
    key: str | None
    seconds: float
    remote: bool = False  # a `cached` stage whose record came from the remote cache
    peak_rss_bytes: int | None = None  # a `built` stage's worker: its peak resident set size in that stage
    # A stage run by a worker: `seconds` is its own work, timed in the worker; this is the
    # rest of the wait for its reply: a free slot (-j), a new worker's process start and
    # TensorFlow import (workers/import_clock.py), on Ray the task's scheduling and transfers.
    worker_startup_seconds: float | None = None
    # A `built` stage's bytes read and written (tpubuild/io_counters.py: rchar, wchar,
    # read_bytes, write_bytes): its worker's over the stage and the build's own for it
    # (the source's copy into the cache, storing a stage's outputs, publishing).
    io: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        startup = self.worker_startup_seconds
        return {"recipe": self.recipe, "stage": self.stage, "status": self.status, "key": self.key,
                "seconds": round(self.seconds, 3), "remote": self.remote, "peak_rss_bytes": self.peak_rss_bytes,
                "worker_startup_seconds": None if startup is None else round(startup, 3), "io": self.io}


@dataclass
class WorkerTime:
    """A stage's time as its worker measured it, and what waiting for that worker added."""

    seconds: float | None = None  # the stage's own work; None: no worker reply (Ray failures, old workers)
    startup: float | None = None

    @classmethod
    def of(cls, reply: dict[str, Any], waited: float) -> WorkerTime:
        own = reply.get("seconds")
        if not isinstance(own, (int, float)):
            return cls(None, None)
        return cls(float(own), max(0.0, waited - own))

    def or_since(self, start: float) -> float:
        """The stage's own seconds, else the engine's clock since `start`."""
        return self.seconds if self.seconds is not None else time.monotonic() - start


def _nothing(*args: Any) -> None:
    return None


@dataclass
class BuildEvents:
    """Who hears what a build does; each unset one hears nothing."""

    printer: Callable[[RecipeRun, Row], None] = _nothing  # each stage's outcome, as it happens
    errors: Callable[[str], None] = _nothing  # failures and warnings, a line each (stderr)
    started: Callable[[RecipeRun, str], None] = _nothing  # a stage begins to run
    notes: Callable[[str], None] = _nothing  # what the build did beside its stages (stdout)
    planned: Callable[[list[RecipeRun]], None] = _nothing  # the runs, each with its plan, before any stage
    # A stage that waits for memory (workers/pool.py MemoryGate): True when it starts to, False when it starts.
    waiting: Callable[[RecipeRun, str, bool], None] = _nothing
