"""The caches a build asks for stage records, behind one protocol, layered: the local store
first, then the remote cache (as Bazel's disk and remote caches share `RemoteCacheClient`
and compose into `DiskAndRemoteCacheClient`). The build loop asks `lookup` before a stage
runs and hands `record` what it built; it never fetches or uploads by hand.

- `LocalLayer`: the resolver's lookup in the local store (records under this user's MAC,
  objects verified, discovered-input candidates from the local dep files).
- `RemoteLayer`: the remote cache (remote/cache.py): a record fetched there is checked,
  its objects re-hashed, and it enters the local store, so the next lookup is local; a
  stage built here is uploaded in the background, only after its inputs were checked
  unchanged (the loop records a stage only then: Bazel #3360). The moves between the two
  are remote/transfer.py's: neither cache reads or writes the other.
- `LayeredCache`: the layers in order; a hit says which layer served it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from tpubuild.pipeline import ENGINE_STEPS, PlannedStage, spec
from tpubuild.remote import fetch_entry, push_entry

if TYPE_CHECKING:
    from tpubuild.engine.resolver import Pending, RecipeRun, Resolver
    from tpubuild.keys import StageEntry


class StageCache(Protocol):
    """One layer: `lookup` the record of a stage run (None on a miss), `record` a stage built
    here, `finish` what runs in the background (wait, or drop what did not start)."""

    name: str

    def lookup(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> StageEntry | None: ...

    def record(self, entry: StageEntry) -> None: ...

    def finish(self, wait: bool) -> None: ...


class LocalLayer:
    """The local store, through the resolver that knows its records and dep files."""

    name = "local"

    def __init__(self, resolver: Resolver, state_lock: threading.RLock):
        self.resolver = resolver
        self.state_lock = state_lock

    def lookup(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> StageEntry | None:
        with self.state_lock:
            return self.resolver.lookup(run, planned, pending)

    def record(self, entry: StageEntry) -> None:
        pass  # the loop stores what it built (Store.put) before it records it anywhere

    def finish(self, wait: bool) -> None:
        pass


class RemoteLayer:
    """The remote cache under the local store (remote/cache.py RemoteCache)."""

    name = "remote"

    def __init__(self, remote: Any, resolver: Resolver, state_lock: threading.RLock,
                 report: Callable[[str], None]):
        self.remote = remote
        self.resolver = resolver
        self.state_lock = state_lock
        self.report = report
        self._uploads: Any = None  # the threads that upload stages built here
        self._lock = threading.Lock()

    def lookup(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> StageEntry | None:
        """The record from the remote cache, entered into the local store; None on a miss.
        Called without the loop's state lock, so that -j N threads download at once: only the
        resolver's steps take it. A bug here is said, and the stage is built locally."""
        try:
            return self._fetch(run, planned, pending)
        except Exception as exc:  # noqa: BLE001 - a bug in tpubuild: said, and the build goes on
            self.report(f"remote cache {self.remote.url}: internal error fetching {run.name}:{planned.name}: "
                        f"{type(exc).__name__}: {exc}")
            return None

    def _fetch(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> StageEntry | None:
        candidate = None
        key = pending.key
        if key is None:  # no key (an input could not be read): nothing to look up
            return None
        if planned.name not in ENGINE_STEPS and spec(planned.name).discovers:
            candidates = self.remote.fetch_discovered(pending.key)
            with self.state_lock:
                candidate = self.resolver.matching_candidate(run, candidates)
            if candidate is None:
                self.remote.note_miss()
                return None
            key = candidate["key"]
        entry = fetch_entry(self.remote, key, self.resolver.store)
        if entry is None:
            return None
        with self.state_lock:
            self.resolver.remember(entry)
            if candidate is not None and pending.key is not None:  # the local dep file learns it
                self.resolver.add_discovered(pending.key, candidate["files"])
        return entry

    def record(self, entry: StageEntry) -> None:
        """Upload a stage built here, in the background; `finish` waits for it."""
        if not self.remote.can_push:
            return
        from concurrent.futures import ThreadPoolExecutor

        with self._lock:
            if self._uploads is None:
                self._uploads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tpubuild-upload")
            self._uploads.submit(self._upload, entry)

    def _upload(self, entry: StageEntry) -> None:
        try:
            push_entry(self.remote, entry, self.resolver.store)  # not the loop's stat cache: its threads share it
        except Exception as exc:  # noqa: BLE001 - a bug in tpubuild: said, and the build goes on
            self.report(f"remote cache {self.remote.url}: internal error uploading stage record {entry.key}: "
                        f"{type(exc).__name__}: {exc}")

    def finish(self, wait: bool) -> None:
        """Wait for the uploads (before the store session ends: gc must not collect their
        objects meanwhile); on an interrupt, drop the ones not started."""
        with self._lock:
            uploads, self._uploads = self._uploads, None
        if uploads is not None:
            uploads.shutdown(wait=wait, cancel_futures=not wait)


class LayeredCache:
    """Layers asked in order; a built stage recorded in each."""

    def __init__(self, layers: list[StageCache]):
        self.layers = layers

    def lookup(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> tuple[StageEntry | None, str | None]:
        """(the record, the name of the layer that had it), or (None, None)."""
        for layer in self.layers:
            entry = layer.lookup(run, planned, pending)
            if entry is not None:
                return entry, layer.name
        return None, None

    def record(self, entry: StageEntry) -> None:
        for layer in self.layers:
            layer.record(entry)

    def finish(self, wait: bool = True) -> None:
        for layer in self.layers:
            layer.finish(wait)
