"""Records and objects moved between the local store and the remote cache: the one place
that knows both. The layered cache (engine/cache.py RemoteLayer) fetches a stage's record
with its objects into the store and uploads what the build made; Ray's driver and nodes
(workers/ray.py) move a stage's inputs and outputs. RemoteCache (remote/cache.py) speaks to
the remote only; Store (store/) to the local cache only (Bazel's DiskAndRemoteCacheClient
composes its disk and remote caches the same way).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tpubuild import progress
from tpubuild.keys import StageEntry, parse_entry

if TYPE_CHECKING:
    from tpubuild.digests import FileEntry, StatCache
    from tpubuild.remote.cache import RemoteCache
    from tpubuild.store import Store

FETCH_THREADS = 4  # concurrent object downloads of one record: each costs a round trip


def fetch_entry(remote: RemoteCache, key: str, store: Store, stat_cache: StatCache | None = None) -> StageEntry | None:
    """The stage record `key` from the remote, with every object the local store lacks
    downloaded and verified, then recorded in the local store (so later lookups are
    local). None on a miss; a malformed record or a wrong object is reported and is a miss
    too, never used."""
    entry = remote.fetch_record(key)
    if entry is None:
        return None
    if not fetch_objects(remote, entry.files, store, stat_cache, owner=f"stage record {key}"):
        remote.note_miss()
        return None
    local = store.add_entry(entry)
    remote.count(hits=1)
    return local


def fetch_objects(remote: RemoteCache, files: Iterable[FileEntry], store: Store,
                  stat_cache: StatCache | None = None, owner: str = "") -> bool:
    """Download the objects of `files` the local store lacks, each re-hashed before it
    enters the store. True when every one is in the local store, verified."""
    wanted = {f.hash: f for f in files}
    missing = [f for digest, f in wanted.items() if not store.has_object(digest, stat_cache)]
    if not missing:
        return True
    if not remote.enabled:
        return False
    work = store.new_workdir("remote-fetch")

    def fetch(f: FileEntry) -> bool:
        with progress.carried(meter):  # the download threads count into the operation's meter
            path = remote.fetch_object(f, os.fspath(work), owner)
            if path is None:
                return False
            with progress.uncounted():  # the check of bytes counted as they came
                store.adopt_object(path, f.hash)
        return True

    try:
        # On a terminal, a large download shows its bytes done and rate (progress.py).
        with progress.meter(f"downloading from {remote.url}", sum(f.size for f in missing)) as meter:
            # All of them, past a wrong one too: every wrong object is reported (and then
            # replaced by a push).
            if len(missing) == 1:
                results = [fetch(missing[0])]
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(missing))) as pool:
                    results = list(pool.map(fetch, missing))
        return all(results) and remote.enabled
    finally:
        store.remove_workdir(work)


def push_objects(remote: RemoteCache, files: Iterable[FileEntry], store: Store,
                 stat_cache: StatCache | None = None) -> bool:
    """Upload the objects of `files` the remote lacks (or holds with a wrong size or a
    content seen wrong), each from its intact copy in the local store. True when the
    remote holds them all."""
    unique = list({f.hash: f for f in files}.values())
    # On a terminal, a large upload shows its bytes done and rate (progress.py).
    with progress.meter(f"uploading to {remote.url}", sum(f.size for f in unique)):
        for f in unique:

            def intact(f: FileEntry = f) -> str | None:
                with progress.uncounted():  # the local copy's check is not the upload
                    return os.fspath(store.object_path(f.hash)) if store.has_object(f.hash, stat_cache) else None

            if not remote.push_object(f, intact):
                return False
    return True


def push_entry(remote: RemoteCache, entry: StageEntry, store: Store, stat_cache: StatCache | None = None) -> bool:
    """Upload `entry`'s objects, then its record (create-only). Only call this for a stage
    whose inputs were verified unchanged after it ran (Bazel #3360). True when the remote
    holds the record."""
    if not remote.can_push:
        return False
    if not push_objects(remote, entry.files, store, stat_cache):
        return False
    return remote.push_record(entry, record_bytes(entry, store))


def record_bytes(entry: StageEntry, store: Store) -> bytes:
    """What to upload for `entry`: the local record byte for byte when it still says what
    the build made, else `entry` itself. Whoever can write the cache can replace that file
    between the build's write and this upload, and the upload (signed with this builder's
    key) would vouch for their files under this key."""
    try:
        data = store.entry_path(entry.key).read_bytes()
    except OSError:
        data = b""
    local, _ = parse_entry(entry.key, data, hash_record=False) if data else (None, "")
    same = local is not None and (local.stage, local.tree, local.files, local.summary, local.warnings,
                                  local.record) == (entry.stage, entry.tree, entry.files, entry.summary,
                                                    entry.warnings, entry.record)
    return data if same else json.dumps(entry.to_json(), sort_keys=True).encode()
