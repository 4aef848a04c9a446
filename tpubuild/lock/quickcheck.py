"""`build --check` without loading a recipe or computing a key: what CI's fresh clone runs.

A lock file's keys were computed from its recipe's files, the workspace file, tpubuild's
code (schemas included), the toolchain and the key variables, and from the inputs its
stages read (the lock file's `inputs`) and what they discovered (`discovered`). The lock
file records a digest of the first ones (`planning`, planning_digest) and the hash of each
of the others: when all of them hash the same now, every key would come out the same, so
building would not change the lock file. That is the no-op memo's proof (lock/memo.py),
made from content instead of stats, which a fresh clone has. Anything else and the full
check (engine/lockcheck.py) decides, computing the keys and naming the stage and cause.

The digest also covers the lock file's own content as the build wrote it (`_pinned`:
stage names, keys, outputs, inputs, version), measured values aside: a line edited by
hand or stitched together by a merge no longer matches, and the full check, which
computes the keys and compares the outputs with the cache, finds it.

Imports only what that needs (no recipe loader, resolver or stage registry): the whole
check of 200 recipes costs about what a no-op build does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tpubuild.digests import StatCache, current_input_hash, hash_bytes, key_env
from tpubuild.keys import canonical_dumps, planning_code_digest
from tpubuild.lock.lockfile import older_layout, read_lock_keys


def planning_digest(ws_file: Path, stat: StatCache, recipe_files: list[Path], root: Path,
                    document: dict[str, Any], recipe: Any | None = None) -> str | None:
    """What decides a lock file's keys besides the inputs its stages read: tpubuild's code
    that decides keys (keys/code.py planning_code_digest, schemas included), the workspace file (defaults, layout), the key variables set and
    the recipe's own files (the recipe, then each `extends` base); and the lock
    `document` itself (`_pinned`). None for a recipe that names files by glob, whose
    meaning depends on the files that match."""
    if recipe is not None and recipe.globs:
        return None
    hashed = [(path, stat.file_hash(str(path))) for path in recipe_files]
    return _planning(stat.file_hash(str(ws_file)), root, hashed, document)


def _planning(workspace_hash: str, root: Path, hashed: list[tuple[Path, str]], document: dict[str, Any]) -> str:
    files = [[_relative(path, root), digest] for path, digest in hashed]
    return hash_bytes(canonical_dumps({"code": planning_code_digest(), "env": key_env(),
                                       "workspace": workspace_hash, "recipe": files,
                                       "lock": _pinned(document)}).encode())


def _pinned(document: dict[str, Any]) -> dict[str, Any]:
    """The part of a lock document its `planning` digest covers: every field a build writes
    (stage names, keys, outputs, what the stages discovered, the inputs) and
    any other, so that a lock file edited by hand or stitched by a merge goes to the full
    check (engine/lockcheck.py compares its outputs with the cache), but `planning` and the
    artifact's facts (a reviewer's, no key among them), and what may differ on the next
    machine: a measured key or output (a build keeps the recorded one, lockfile.same_keys)
    and a stage's measured peak memory."""
    stages = [{**{k: v for k, v in stage.items() if k != "peak_memory"},  # measured: differs on the next machine
               "key": None if stage.get("key_measured") else stage.get("key"),
               "output": None if stage.get("measured") else stage.get("output")}
              if isinstance(stage, dict) else stage for stage in document.get("stages") or []]
    return {**{name: value for name, value in document.items() if name not in ("planning", "artifact")},
            "stages": stages}


def _relative(path: Path, root: Path) -> str:
    """`path` relative to `root`, POSIX: a prefix cut where it is below root (os.path.relpath
    makes both absolute first, a cost per recipe that the check of 200 recipes notices)."""
    text, prefix = str(path), f"{root}{os.sep}"
    if text.startswith(prefix) and os.sep == "/" and "/../" not in text and "/./" not in text:
        return text[len(prefix):]
    return Path(os.path.relpath(path, root)).as_posix()


def quick_check(start: Path, override: Path | None) -> int | None:
    """The number of lock files, when every recipe of the workspace is proven up to date
    (module docstring); None sends `--check` down its full path. Recipes that name files by
    glob record no `planning` (a new match changes their meaning): any such recipe, or any
    difference, and the full path decides."""
    from tpubuild.config.finding import (
        STATE_DIR,
        discover_files,
        extends_chain,
        lock_file_of,
        workspace_file_for,
    )
    from tpubuild.digests import toolchain

    ws_file = workspace_file_for(start, override)
    if ws_file is None:
        return None
    root = ws_file.parent.resolve()
    try:
        ws_bytes = ws_file.read_bytes()
    except OSError:
        return None
    globs = _recipe_globs(ws_bytes)  # a workspace file that hashes as the lock files record was valid
    if globs is None:
        return None
    files = discover_files(root, globs, ws_file)
    if not files:
        return None
    stat = StatCache(root / STATE_DIR / "statcache.json")
    ws_hash, tools = hash_bytes(ws_bytes), toolchain()
    names: set[str] = set()
    for recipe_file in files:
        lock = read_lock_keys(lock_file_of(recipe_file))
        if lock is None or lock.get("recipe") in names or dict(lock.get("toolchain") or {}) != tools \
                or older_layout(lock):
            return None
        chain = extends_chain(recipe_file)  # each file read once, to find its base and to hash it
        hashed = None if chain is None else [(path, hash_bytes(data)) for path, data in chain]
        if hashed is None or lock.get("planning") != _planning(ws_hash, root, hashed, lock):
            return None
        names.add(str(lock.get("recipe")))
        inputs = lock.get("inputs") or {}
        if not all(_same(root, stat, name, digest) for name, digest in inputs.items()):
            return None
        for stage in lock.get("stages") or []:
            discovered = stage.get("discovered") or {}
            if not all(_same(root, stat, name, digest) for name, digest in discovered.items()):
                return None
    stat.save(prune=False)  # what it hashed; the build's entries are not this command's to check
    return len(files)


def _recipe_globs(ws_bytes: bytes) -> list[str] | None:
    """The workspace file's `recipes:` globs: by config/finding.py's reader of the plain
    forms, else by PyYAML; None when they are not a list of strings."""
    from tpubuild.config.finding import DEFAULT_RECIPE_GLOBS, recipe_globs_in

    try:
        text = ws_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return None
    globs = recipe_globs_in(text)
    if globs is not None:
        return globs
    import yaml

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (ValueError, yaml.YAMLError):
        return None
    globs = (data or {}).get("recipes", list(DEFAULT_RECIPE_GLOBS)) if isinstance(data, dict) or data is None else None
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        return None
    return globs


def _same(root: Path, stat: StatCache, name: str, digest: Any) -> bool:
    """Whether an input of a lock file (`file:`, `import:`, `dir:`) or a discovered one
    (a path, present or absent, or `dist:`) hashes now as recorded, the way the resolver
    hashes it (keys.current_input_hash)."""
    from tpubuild.digests import ABSENT

    kind, _, rel = name.partition(":")
    if kind == "dir":
        directory = root / rel
        return directory.is_dir() and stat.tree(directory)[0] == digest
    if kind in ("file", "import"):
        name = rel
    if os.path.isabs(name):
        return False  # code outside the workspace: the full path compares it
    return (current_input_hash(root, stat, name) or ABSENT) == digest
