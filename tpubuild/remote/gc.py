"""`tpubuild gc --remote`: the local retention rules (store/gc.py `choose_removals`)
applied to a remote cache.

A remote has no registry of the workspaces that use it, and its records cannot be
touched on use (they are create-only), so "last used" is a record's creation time and
"referenced" is what the lock files of the workspace running gc name (run it from the
main branch's CI, whose lock files are what the team builds). Kept: referenced records,
records created within the window (`--keep-days`, default 30) or, with `--max-size`,
the newest records that fit; the objects kept records name. Removed: the other records
first (a reader then misses, never meets a record without objects), then their
discovered-input candidates, then objects no kept record names. Objects younger than
the grace period are kept: an upload in progress writes its objects before its record.
Only `<url>/v1/{stages,signed,objects,discovered}/` is ever listed, so nothing else is deleted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tpubuild.errors import TpubuildError
from tpubuild.keys import RECORD_LIMIT
from tpubuild.remote.cache import RemoteCache
from tpubuild.store import GcResult, choose_removals
from tpubuild.transport import ObjectTooLarge

GRACE_SECONDS = 3600.0  # an upload in progress: objects first, then (within minutes) its record
# A whole layer of the remote is listed at once (one paginated call per prefix): longer
# than one request's total_timeout, still bounded.
LIST_DEADLINE = 600.0


class RemoteGcError(TpubuildError):
    exit_code = 1


def collect_remote(remote: RemoteCache, referenced: set[str], keep_days: float | None, max_size: int | None,
                   notify: Callable[[str], None] = lambda m: None, now: float | None = None) -> GcResult:
    now = time.time() if now is None else now
    io = remote.backend()
    try:
        return _collect(io, referenced, keep_days, max_size, notify, now)
    except Exception as exc:  # the SDKs raise their own types: one line, exit 1
        raise RemoteGcError(f"remote cache {remote.url}: gc stopped: {' '.join(str(exc).split())[:300]}") from exc


def _collect(io: Any, referenced: set[str], keep_days: float | None, max_size: int | None,
             notify: Callable[[str], None], now: float) -> GcResult:
    records = []  # (created, key, rel, object hashes)
    # A signed record (digests/signing.py) is the same record with a signature: its
    # key is kept or removed with the unsigned one, and its objects count as named.
    listed = [(rel, mtime, False) for rel, _size, mtime in io.list("stages", LIST_DEADLINE)]
    listed += [(rel, mtime, True) for rel, _size, mtime in io.list("signed", LIST_DEADLINE)]
    for rel, mtime, signed in listed:
        if not rel.endswith(".json"):
            continue
        key = rel.rsplit("/", 1)[-1][: -len(".json")]
        try:
            document = json.loads(io.read(rel, RECORD_LIMIT))
            hashes = {f[1] for f in (json.loads(document["record"]) if signed else document).get("files", [])}
        except FileNotFoundError:
            continue  # removed meanwhile
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, ObjectTooLarge):
            notify(f"remote stage record {rel} is malformed; it is removed when unreferenced and old")
            hashes = set()
        records.append((mtime, key, rel, hashes))
    objects = {"".join(rel.split("/")[1:3]): (size, mtime)
               for rel, size, mtime in io.list("objects", LIST_DEADLINE)}
    sizes = {digest: size for digest, (size, _) in objects.items()}
    removed = choose_removals([(r[0], r[1], r[3]) for r in records], sizes, referenced, keep_days, max_size, now)
    io.delete([r[2] for r in records if r[1] in removed])
    kept_keys = {r[1] for r in records if r[1] not in removed}
    grace = min(GRACE_SECONDS, (keep_days if keep_days is not None else 30) * 86400)
    stale_candidates = [rel for rel, _size, mtime in io.list("discovered", LIST_DEADLINE)
                        if rel.rsplit("/", 1)[-1].removesuffix(".json") not in kept_keys and mtime < now - grace]
    io.delete(stale_candidates)
    live = {h for r in records if r[1] not in removed for h in r[3]}
    dead = [d for d, (_size, mtime) in objects.items() if d not in live and mtime < now - grace]
    io.delete([f"objects/{d[:2]}/{d[2:]}" for d in dead])
    if hasattr(io, "stale_temps"):  # a shared directory: temp files of killed writers
        io.delete(io.stale_temps(now - 86400))
    return GcResult(len(removed), len(dead), sum(sizes[d] for d in dead), sum(sizes.get(h, 0) for h in live))
