"""How far long byte work is: a copy, hash, upload or download of a large model.

An operation that moves many bytes opens a meter (`with meter("copying into the cache",
total):`); the functions that read, copy or send the bytes (digests/hashing.py, fs/place.py,
transport/backends.py) call `advance(n)`, which counts into the meter of the calling
thread. Only a terminal shows meters: the build's live line (commands/build_output.py)
`watch`es, and shows a meter once its operation has run SHOW_AFTER seconds (2), with the bytes
done and the rate. Without a watcher (not a terminal, `--json`, every other command)
`meter` opens nothing and `advance` counts nothing.

A byte is counted once: the check that hashes a copy just made is `uncounted` (its bytes
were counted as they were copied).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

# An operation shorter than this never shows: "more than a few seconds". The variable sets
# it (tests show a small model's copy at once); a display knob, in no key.
SHOW_AFTER = 2.0
SHOW_AFTER_ENV = "TPUBUILD_PROGRESS_AFTER"


def show_after() -> float:
    try:
        return max(0.0, float(os.environ.get(SHOW_AFTER_ENV, SHOW_AFTER)))
    except ValueError:
        return SHOW_AFTER


class Meter:
    """The bytes done of one operation, of `total`."""

    __slots__ = ("done", "started", "total", "what")

    def __init__(self, what: str, total: int):
        self.what = what
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        self.done += n  # one thread's meter, or one the threads share (an int add under the GIL)
        _changed()

    def line(self, now: float) -> str:
        """`copying into the cache 412.0 MiB of 1.2 GiB, 350.1 MiB/s`."""
        elapsed = max(now - self.started, 1e-6)
        done = min(self.done, self.total)
        return f"{self.what} {_size(done)} of {_size(self.total)}, {_size(done / elapsed)}/s"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_lock = threading.Lock()
_board: list[Meter] | None = None  # the meters open now, while a terminal watches
_after = SHOW_AFTER
_local = threading.local()


def watch(redraw: Callable[[], None] | None = None) -> None:
    """A terminal shows meters from now on (the build's live line); `redraw` is called,
    at most every REDRAW_EVERY seconds, when a meter it would show changed."""
    global _board, _after, _redraw
    with _lock:
        _board = []
        _after = show_after()
        _redraw = redraw


# The live line is redrawn this often at most for a meter's change (its own ticker redraws
# it four times a second besides).
REDRAW_EVERY = 0.1
_redraw: Callable[[], None] | None = None
_drawn_at = [0.0]


def _changed(at_once: bool = False) -> None:
    redraw = _redraw
    if redraw is None:
        return
    now = time.monotonic()
    if at_once or now - _drawn_at[0] >= REDRAW_EVERY:
        _drawn_at[0] = now
        redraw()


def unwatch() -> None:
    global _board, _redraw
    with _lock:
        _board = None
        _redraw = None


def showing(now: float | None = None) -> list[str]:
    """The lines of the meters open for SHOW_AFTER seconds or more, oldest first."""
    now = time.monotonic() if now is None else now
    with _lock:
        meters = list(_board or [])
    return [m.line(now) for m in meters if now - m.started >= _after and m.total > 0]


@contextmanager
def meter(what: str, total: int) -> Iterator[Meter | None]:
    """A meter of `total` bytes for the calling thread's `advance`s inside the block, when
    a terminal watches; else None, and nothing is counted."""
    board = _board
    if board is None or total <= 0:
        yield None
        return
    m = Meter(what, total)
    with _lock:
        board.append(m)
    # A meter shown from its start (SHOW_AFTER 0) is drawn now, not at the next change
    # the throttle lets through: a copy shorter than REDRAW_EVERY would never show.
    _changed(at_once=_after <= 0)
    before = getattr(_local, "meter", None)
    _local.meter = m
    try:
        yield m
    finally:
        _local.meter = before
        with _lock:
            if m in board:
                board.remove(m)


@contextmanager
def carried(m: Meter | None) -> Iterator[None]:
    """Count this thread's `advance`s into `m` (a meter another thread opened: a pool of
    download threads working for one operation)."""
    before = getattr(_local, "meter", None)
    _local.meter = m if m is not None else before
    try:
        yield
    finally:
        _local.meter = before


@contextmanager
def uncounted() -> Iterator[None]:
    """The bytes read inside the block are not counted (a copy's check)."""
    before = getattr(_local, "meter", None)
    _local.meter = None
    try:
        yield
    finally:
        _local.meter = before


def current() -> Meter | None:
    return getattr(_local, "meter", None)


def advance(n: int) -> None:
    """Count `n` bytes into the calling thread's meter, if it has one."""
    m = getattr(_local, "meter", None)
    if m is not None:
        m.add(n)
