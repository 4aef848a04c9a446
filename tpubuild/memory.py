"""Give memory a released model held back to the operating system, between the models a
stage loads one after another (verify's source and twin; quantize's calibration session
before TF's quantizer).

A loaded SavedModel's buffers are freed when it is let go, but glibc's malloc keeps freed
pages in its arenas (TensorFlow's CPU allocator is malloc underneath), so the next model
is loaded on top of the last one's footprint. `malloc_trim(0)` returns the free pages of
every arena (glibc >= 2.8 also releases free chunks inside the heap, not only its top;
malloc_trim(3)). Measured on ResNet50 (benchmarks/real_models.py): the process held
~210 MiB more after running the CPU twin than before; after trimming, ~120 MiB. Not glibc
(musl, macOS): nothing to do, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from functools import cache


@cache
def _malloc_trim():  # type: ignore[no-untyped-def]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory(collect: bool = True) -> None:
    """Collect Python's cycles (a loaded model's objects are full of them; with TensorFlow
    imported a full collection takes ~0.13 s, so only where a model was let go), then hand
    malloc's free pages back (~0.2 ms)."""
    if collect:
        gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# --- how much memory the machine has ------------------------------------------------------
# TPUBUILD_MEMORY_AVAILABLE=<bytes>: the memory a build may use, instead of what
# /proc/meminfo says (tests, and users who share a machine or whose limit is a cgroup's). A
# scheduling knob: it decides when a stage starts (workers/pool.py MemoryGate) and whether
# verify's source side runs beside (engine/beside.py), never what a stage makes, so it is in
# no key.
AVAILABLE_ENV = MEMORY_AVAILABLE_ENV = "TPUBUILD_MEMORY_AVAILABLE"


def _meminfo(field: str) -> int | None:
    """A field of /proc/meminfo in bytes (proc(5): values in kB), None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_override() -> int | None:
    """TPUBUILD_MEMORY_AVAILABLE in bytes, or None when unset. A value that is not a whole
    number of bytes is a UsageError (parsed as workers.bytes_knob does, which this low layer
    does not import: it is in every stage's key closure)."""
    value = os.environ.get(AVAILABLE_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        from tpubuild.errors import UsageError

        raise UsageError(f"{AVAILABLE_ENV}={value!r}: expected a whole number of bytes (default: "
                         "/proc/meminfo MemAvailable)")
    return int(value)


def available_memory_bytes() -> int | None:
    """The memory available to new work now: TPUBUILD_MEMORY_AVAILABLE when set, else the
    kernel's MemAvailable (what can be allocated without swapping: free memory plus the
    page cache and slabs it can reclaim; Linux >= 3.14). None when neither is known (not
    Linux): callers decide as if memory were not the limit."""
    override = memory_override()
    return override if override is not None else _meminfo("MemAvailable")


def total_memory_bytes() -> int | None:
    """The machine's memory: TPUBUILD_MEMORY_AVAILABLE when set (all a build may use),
    else MemTotal. None when unknown."""
    override = memory_override()
    return override if override is not None else _meminfo("MemTotal")


def process_rss_bytes(pid: int) -> int | None:
    """The resident set size of process `pid` now (/proc/<pid>/statm: pages), None if gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
