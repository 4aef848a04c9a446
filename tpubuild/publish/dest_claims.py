"""Whose claim a number of a publish destination is (`.tpubuild/claims/<N>`, a document of
the job that took it: publish/dest_write.py), and whether that job is gone for good
(publish/dest_mend.py): on this machine its process ended, anywhere its budget passed.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from tpubuild.publish.dest_state import CLOCK_MARGIN, UNCLAIMED_AGE


def _machine() -> str:
    """This machine's boot and PID namespace: two processes with one value see each other's
    PIDs (two containers on one host share the boot id, not the namespace)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}:{namespace}"


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22): with
    the PID, names one process even after its PID is reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]


def whoami() -> dict[str, Any]:
    return {"host": socket.gethostname(), "machine": _machine(), "pid": os.getpid(), "started": _started(os.getpid())}


def job_gone(claim: dict[str, Any] | None, claimed: float | None, staged: float, now: float) -> bool:
    """Whether the job that staged a number has stopped for good: on this machine, its
    process ended; anywhere, its budget and CLOCK_MARGIN have passed since its claim."""
    if claim is None:
        return now - max(staged, claimed or 0.0) > UNCLAIMED_AGE
    machine = _machine()
    if machine and claim.get("machine") == machine and isinstance(claim.get("pid"), int) \
            and _started(claim["pid"]) != claim.get("started"):
        return True
    budget = claim.get("budget")
    start = claimed if claimed else staged
    return isinstance(budget, (int, float)) and now - start > budget + CLOCK_MARGIN
