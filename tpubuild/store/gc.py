"""Cache garbage collection: keep what any workspace using the cache references, and what
was used recently.

A cache can be shared by several workspaces (`cache_dir` pointing to one directory), so
the lock files of the workspace running `gc` are not enough: every workspace registers
the stage keys it references in the store's index: at the end of each build, per recipe,
the keys that build used (measured keys included, which a lock file written on another
machine does not name: store/registration.py); at each `gc`, the keys its lock files name.
`gc` keeps the keys of every registered workspace that still exists. It runs with
the store held exclusively (`Store.exclusive`): no build using the cache is running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tpubuild.store.store import Store

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace


@dataclass
class GcResult:
    entries_removed: int
    objects_removed: int
    bytes_freed: int
    bytes_kept: int


def collect(
    store: Store,
    referenced: set[str],
    keep_days: float | None,
    max_size: int | None,
    notify: Callable[[str], None] = lambda m: None,
) -> GcResult:
    """Drop stage entries that neither `referenced` (the current workspace's lock files)
    nor any registered workspace references and that were not used within `keep_days`
    (or, with `max_size`, the least recently used until the cache fits)."""
    with store.exclusive(notify=notify):
        for keys in store.workspace_references().values():
            referenced = referenced | keys
        return _collect(store, referenced, keep_days, max_size)


def _collect(store: Store, referenced: set[str], keep_days: float | None, max_size: int | None) -> GcResult:
    # The store scans by descriptor, never through a link; damage it meets (a link, a
    # directory or a FIFO where a record or an object should be, an unreadable record) is
    # removed with a warning. The counts say what was removed: a damaged record counts as a
    # removed entry, damage in objects/ is not an object.
    entries, damaged = store.scan_records()  # (last used, key, object hashes, tree)
    sizes = store.object_sizes()
    removed_keys = choose_removals([(e[0], e[1], e[2]) for e in entries], sizes, referenced, keep_days, max_size)
    kept = [e for e in entries if e[1] not in removed_keys]
    entries_removed = damaged + sum(1 for e in entries if e[1] in removed_keys and store.remove_record(e[1]))
    live = {h for e in kept for h in e[2]}
    live_trees = {e[3] for e in kept}
    objects_removed = freed = 0
    gone = set()
    for digest, size in sizes.items():
        if digest not in live and store.discard_object(digest):
            objects_removed += 1
            freed += size
            gone.add(digest)
    for tree in store.tree_names():
        if tree not in live_trees:
            store.remove_tree(tree)  # renamed away first: never half a checkout
    store.forget(removed_keys, gone)
    return GcResult(entries_removed, objects_removed, freed, sum(sizes.get(h, 0) for h in live))


def choose_removals(entries: list[tuple[float, str, set[str]]], sizes: dict[str, int], referenced: set[str],
                    keep_days: float | None, max_size: int | None, now: float | None = None) -> set[str]:
    """The retention rules, shared by the local store and the remote cache: of the
    entries (last used, key, object hashes), the keys to remove. Referenced keys always
    stay; with `max_size`, the least recently used others go until the objects the rest
    reference fit; else the others not used within `keep_days` (default 30) go."""
    removed: set[str] = set()
    if max_size is not None:
        live = {h for e in entries for h in e[2]}
        total = sum(sizes.get(h, 0) for h in live)
        for used, key, hashes in sorted(entries, key=lambda e: (e[0], e[1])):
            if total <= max_size:
                break
            if key in referenced:
                continue
            removed.add(key)
            still = {h for e in entries if e[1] not in removed for h in e[2]}
            total = sum(sizes.get(h, 0) for h in still)
        return removed
    horizon = (time.time() if now is None else now) - (keep_days if keep_days is not None else 30) * 86400
    return {key for used, key, _ in entries if key not in referenced and used < horizon}


def workspace_references(ws: Workspace, lock_files: list[Path],
                         store: Store | None = None) -> tuple[dict[str, set[str]], set[str]]:
    """What a workspace references, as its store registration holds it: the keys its lock
    files name (under used_keys.LOCK_FILES), and per recipe that still has a lock file,
    the keys its last build used (store/registration.py: the measured keys of this machine,
    which the lock file may not name), when it registered them with `store`'s index. And
    the names of the recipes that have a lock file: the others' references are forgotten."""
    from tpubuild.lock import read_lock
    from tpubuild.store.registration import LOCK_FILES, registered

    refs: dict[str, set[str]] = {LOCK_FILES: set()}
    recipes = set()
    for path in lock_files:
        lock = read_lock(path) or {}
        refs[LOCK_FILES].update(s["key"] for s in lock.get("stages", []) if s.get("key"))
        if isinstance(lock.get("recipe"), str):
            recipes.add(lock["recipe"])
    for recipe, keys in (registered(ws, store) if store is not None else {}).items():
        if recipe in recipes and recipe != LOCK_FILES:
            refs[recipe] = set(keys)
    return refs, recipes


