"""What one stage leaves in its worker process for the next stage the engine hands that
worker to, and the worker's private scratch directory: the small protocol stages and
the worker process share (verify keeps its loaded CPU twin for report, tpu/twin.py).
Nothing here knows the pool or the build loop: a stage's key covers this module.
"""

from __future__ import annotations

from typing import Any

# A worker's private scratch directory (its HOME), removed with it: what one of its stages
# keeps there for a later one (tpu/twin.py cpu_twin) goes with the worker.
WORKER_SCRATCH = "TPUBUILD_WORKER_SCRATCH"
# What a stage leaves in its worker for the next stage the engine hands that worker to
# (engine/loop.py HANDOFF: verify's loaded CPU twin, for report's HLO). Kept only while
# a stage runs whose request says the worker is handed on (`keep_for`, set by main), so a
# stage that is not handed on pays nothing for it and leaves nothing under another stage's
# peak; outside a worker nothing is kept.
_HANDED_ON: dict[Any, Any] = {}
_HANDING_ON = [False]  # the running stage's request has `keep_for`


def hand_on(key: Any, value: Any) -> bool:
    """Keep `value` for the stage this worker is handed on to; False (nothing kept, the
    caller lets it go) when the worker is not handed on after this stage, or outside a worker."""
    if not _HANDING_ON[0]:
        return False
    _HANDED_ON[key] = value
    return True


def handed_on(key: Any) -> Any:
    """What an earlier stage of this worker kept under `key` (taken), else None."""
    return _HANDED_ON.pop(key, None)


def begin_stage(handing_on: bool) -> None:
    """A stage starts in this worker; `handing_on`: its request says the worker is handed on after it."""
    _HANDING_ON[0] = handing_on


def end_stage() -> None:
    """A stage ended: unless the worker is handed on, let go of what an earlier stage kept
    and this one did not take."""
    if not _HANDING_ON[0] and _HANDED_ON:
        _HANDED_ON.clear()
        from tpubuild.memory import release_memory

        release_memory()
