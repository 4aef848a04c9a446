"""What a build is asked to do beside its recipes (`tpubuild build`'s options): engine/loop.py
`build` and `Engine` take them as one `BuildOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpubuild.lock import NoopMemo

__all__ = ["BuildOptions"]


@dataclass(frozen=True)
class BuildOptions:
    jobs: int = 1  # -j: stages run at once
    lock_wait: float = 3600.0  # seconds to wait for the workspace lock
    # With a NoopMemo, every recipe the full check finds up to date is remembered (if its
    # files are older than `since_ns`).
    memo: NoopMemo | None = None
    since_ns: int | None = None
    # (url, push): stages missing locally are looked up in that remote cache and stages
    # built here are uploaded to it; a build with nothing to do never contacts it.
    remote: tuple[str, bool] | None = None
    keep_going: bool = False  # build --keep-going: a failed target does not stop its recipe's publish
    relock: bool = False  # build --relock: lock files rewritten with this machine's measured figures
