"""What `tpubuild build` prints, as the build tools people know print it (Bazel, Cargo).

- A row per stage that did work (built) or failed, never one per cached stage: a build of
  200 recipes where two changed prints a few rows, not 2000. `-v` lists every stage,
  cached and skipped ones too, and each built stage's worker start-up; `-q` prints no rows.
- `published: RECIPE -> out/RECIPE/N` for each recipe that published a new version;
  `RECIPE: out/RECIPE/N unchanged (report updated)` for one that re-measured the same
  model (publish/refresh.py); `published: RECIPE -> s3://.../RECIPE/M` for a new
  version on its `publish_to:` destination.
- The summary line last: `14 recipes: 108 built, 2 cached, 1 failed`, and `1 not
  published to its destination` for a recipe whose `publish_to:` publish failed.
- On a terminal, one live line at the bottom, redrawn in place: `[n/N]` stages done of
  the build's, the stages running and for how long (Bazel's `[n / N]`; a stage the pool
  holds back until the memory it is estimated to need is free says `waiting for memory`), and a copy,
  hash, upload or download that has run for a few seconds with its bytes done and rate
  (`[1/9] copying into the cache 412.0 MiB of 1.2 GiB, 350.1 MiB/s · running big: source 4 s`:
  tpubuild/progress.py). Colour for
  built, cached, failed and skipped, off when NO_COLOR is set (https://no-color.org) or
  for a dumb terminal. Piped (a CI log, `| tee`), no live line and no colour: the same
  rows, each written once.

Errors and warnings go to stderr, on every level. `build --dry-run` prints with the same
functions, in `explain`'s words (engine/explain.py stage_words).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Any, Callable, TextIO

from tpubuild import progress
from tpubuild.build_words import paint, summary_line

# How much a build prints: -q, default, -v.
QUIET, NORMAL, VERBOSE = 0, 1, 2

# The summary's order of states.
BUILD_STATES = ("built", "cached", "failed", "skipped")


def _destination(count: int) -> str:
    return "its destination" if count == 1 else "their destinations"


def stage_line(recipe: str, stage: str, word: str, detail: str, colour: bool) -> str:
    """One row: `toy: tpu: built (0.41 s)`, the same shape for build and dry-run."""
    return f"{recipe}: {stage}: {paint(word, word, colour)}{f' ({detail})' if detail else ''}"


class BuildOutput:
    """The printer, error sink and progress line of one build (the engine's callbacks)."""

    def __init__(self, out: TextIO, verbosity: int, tty: bool, colour: bool, display: Callable[[Any], str]):
        self.out, self.verbosity, self.tty, self.colour = out, verbosity, tty, colour
        self.display = display  # a published directory as the user reads it (workspace-relative)
        self.live = tty and verbosity >= NORMAL
        self.lock = threading.Lock()
        self.total = 0
        self.done = 0
        self.running: dict[tuple[str, str], float] = {}
        self.waiting_memory: set[tuple[str, str]] = set()  # stages the pool holds back (workers/pool.py MemoryGate)
        self.drawn: str | None = None  # the live line on screen now
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    # --- the engine's callbacks -------------------------------------------------------
    def planned(self, runs: list[Any]) -> None:
        with self.lock:
            self.total = sum(len(run.plan) for run in runs)
        if self.live:  # from now on: checking a large model's inputs takes seconds too
            progress.watch(self._redraw)  # long copies, hashes, uploads and downloads: bytes done and rate
            self.ticker = threading.Thread(target=self._tick, name="tpubuild-progress", daemon=True)
            self.ticker.start()

    def started(self, run: Any, stage: str) -> None:
        if not self.live:
            return
        with self.lock:
            self.running[(run.name, stage)] = time.monotonic()
            if self.ticker is not None:
                self._draw()

    def waiting(self, run: Any, stage: str, waits: bool) -> None:
        """A stage waits for memory (True) or has started after waiting (False): said on the
        live line, `toy: verify waiting for memory 3 s`, its clock restarted when it starts."""
        if not self.live:
            return
        with self.lock:
            key = (run.name, stage)
            if waits:
                self.waiting_memory.add(key)
            else:
                self.waiting_memory.discard(key)
                self.running[key] = time.monotonic()
            if self.ticker is not None:
                self._draw()

    def row(self, run: Any, row: Any) -> None:
        with self.lock:
            self.done += 1
            self.running.pop((row.recipe, row.stage), None)
            self.waiting_memory.discard((row.recipe, row.stage))
            lines = []
            if self.verbosity >= VERBOSE or (self.verbosity >= NORMAL and row.status in ("built", "failed")):
                lines.append(stage_line(row.recipe, row.stage, self._word(row), self._detail(row), self.colour))
            if self.verbosity >= NORMAL and row.stage == "publish" and row.status == "built" \
                    and run.version is not None:
                where = self.display(run.outputs["publish"].directory / str(run.version))
                if run.updated_in_place:  # re-measured, the same model: no new version
                    lines.append(f"{run.name}: {where} unchanged (report updated)")
                else:
                    lines.append(f"{paint('published', 'published', self.colour)}: {run.name} -> {where}")
            if lines:
                self._clear()
                self.out.write("".join(line + "\n" for line in lines))
            if self.ticker is not None:
                self._draw()
            self.out.flush()

    def note(self, line: str) -> None:
        """A line of what the build did beside its stages (a publish destination's)."""
        if self.verbosity < NORMAL:
            return
        with self.lock:
            self._clear()
            if line.startswith("published:"):
                line = paint("published", "published", self.colour) + line[len("published"):]
            self.out.write(line + "\n")
            if self.ticker is not None:
                self._draw()
            self.out.flush()

    def error(self, message: str) -> None:
        with self.lock:
            self._clear()
            self.out.flush()
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
            if self.ticker is not None:
                self._draw()

    # --- the end ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the live line and erase it (also when the build was interrupted)."""
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
            progress.unwatch()
        with self.lock:
            self._clear()
            self.out.flush()

    def summary(self, runs: list[Any]) -> None:
        self.close()
        counts: dict[str, int] = {}
        for run in runs:
            for row in run.rows:
                counts[row.status] = counts.get(row.status, 0) + 1
        line = summary_line(len(runs), counts, BUILD_STATES, self.colour)
        # A recipe whose stages all built but whose publish_to destination failed failed
        # the build (exit 1): the last line says so, not only the stderr line above it.
        unpublished = sum(1 for run in runs if getattr(run, "destination_error", None))
        if unpublished:
            line += ", " + paint(f"{unpublished} not published to {_destination(unpublished)}", "failed", self.colour)
        self.out.write(line + "\n")
        self.out.flush()

    # --- drawing --------------------------------------------------------------------------
    def _word(self, row: Any) -> str:
        return row.status

    def _detail(self, row: Any) -> str:
        if row.status == "cached":
            # A local cache hit took no work worth timing (a lookup); a remote one, a download.
            return f"from the remote cache, {row.seconds:.2f} s" if row.remote else ""
        if row.status == "skipped":
            return ""
        detail = f"{row.seconds:.2f} s"
        startup = getattr(row, "worker_startup_seconds", None)
        if self.verbosity >= VERBOSE and startup is not None:
            detail += f", worker start-up {startup:.2f} s"
        return detail

    def _redraw(self) -> None:
        """A meter changed (progress.py, from the thread doing the work)."""
        with self.lock:
            self._draw()

    def _tick(self) -> None:
        while not self.stop.wait(0.25):
            with self.lock:
                self._draw()

    def _draw(self) -> None:
        """The live line (the lock held): `[3/12] running toy: tpu 4 s, other: verify 1 s`."""
        now = time.monotonic()
        held = self.waiting_memory
        running = ", ".join(f"{recipe}: {stage}{' waiting for memory' if (recipe, stage) in held else ''} "
                            f"{now - since:.0f} s"
                            for (recipe, stage), since in sorted(self.running.items(), key=lambda item: item[1]))
        idle = "finishing" if self.done >= self.total else "checking the cache"  # lock files, workers' exit
        # A copy, hash or transfer that has run for a few seconds, first: cut last.
        meters = "".join(f"{line} · " for line in progress.showing(now))
        text = f"[{self.done}/{self.total}] {meters}" + (f"running {running}" if running else idle)
        width = shutil.get_terminal_size((100, 24)).columns - 1  # never wraps: \r would not reach the start
        text = text[:max(width, 20)]
        if text != self.drawn:  # a terminal recording gets a change, not four frames a second
            self.out.write("\r\033[K" + text)
            self.out.flush()
            self.drawn = text

    def _clear(self) -> None:
        if self.drawn is not None:
            self.out.write("\r\033[K")
            self.drawn = None
