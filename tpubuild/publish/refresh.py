"""Updating the newest version in place when a build re-measured the same model.

A publish whose model files (the SavedModel with its warmup requests, and every target's
artifact) are byte-identical to the newest version's publishes no new number: only what
describes the model differs (the report files, the verification figures and latencies in
the manifest, the provenance statement, the signature). Those are rewritten beside the
model files, which are never touched unless damaged (then restored from the store, as a
repair does), so a model server watching the base path sees nothing change.

The new files are made in a temp directory beside the version (`.tmp-*`, what `clean`
and publish remove), complete: every file of the version (model files as hard links to
their store objects), the new manifest, then the provenance statement and the signature
over exactly those bytes. Then each file that differs is renamed over the version's (each
rename atomic), target versions first, the main version's manifest last but for the
report files it adds (`_update_dir`: the manifest is the commit point). A build killed
between two renames leaves a version the next build completes: before the main manifest,
the same model with other content, updated again; after it, the version's own content
with files missing, restored as any damage is (versions.newest_matching). Meanwhile
`tpubuild verify` names the files that differ from the manifest; the model files never do.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from tpubuild.atomic import fsync_path
from tpubuild.digests import FileEntry, StatCache
from tpubuild.fs import place_file
from tpubuild.provenance.statement import PROVENANCE, SIGNATURE
from tpubuild.publish import targets as target_versions
from tpubuild.publish.targets import MANIFEST
from tpubuild.publish.versions import OWN_FILES, read_manifest


def update_version(
    recipe_dir: Path,
    number: int,
    files: list[tuple[FileEntry, Path]],
    manifest: dict[str, Any],
    stat_cache: StatCache,
    link_type: str = "copy",
    finish: Callable[[Path, dict[str, Any], str | None], None] | None = None,
) -> list[Path]:
    """Make version `number` of `recipe_dir` hold `files` ((entry, verified object) pairs,
    target files named `<target>/<path>`) and describe itself by `manifest` (the one a
    new version would get, given `number`); returns the paths written. The caller checked
    that the version holds the same model (versions.newest_same_model). `finish` as for
    versions.publish: the statement and the signature of a version's temp directory."""
    targets = sorted(manifest.get("targets") or {})
    main, by_target = target_versions.split_by_target(files, targets)
    old = read_manifest(recipe_dir / str(number)) or {}
    manifest = dict(manifest, version=number)
    if "created" in old:  # when the version appeared; the rest describes this build
        manifest["created"] = old["created"]
    written: list[Path] = []
    for target in targets:
        sealed = None if finish is None else (lambda d, t=target: finish(d, manifest, t))
        target_dir = recipe_dir / target
        listed = by_target[target]
        own = target_versions.target_manifest(manifest, target)
        if not os.path.lexists(target_dir / str(number)):  # a killed publish's: whole, by a rename
            path = target_versions.write_version(target_dir, number, listed, own, link_type, sealed)
            written += [path / rel for rel, _ in listed] + [path / name for name in sorted(OWN_FILES)
                                                            if (path / name).exists()]
            for rel, (entry, _) in listed:
                stat_cache.record(os.fspath(path / rel), os.stat(path / rel), entry.hash)
            continue
        previous = set(((old.get("targets") or {}).get(target) or {}).get("files", {}))
        written += _update_dir(target_dir / str(number), listed, target_versions.manifest_bytes(own), previous,
                               stat_cache, link_type, sealed)
    main_manifest = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()  # as versions.publish writes it
    seal_main = None if finish is None else (lambda d: finish(d, manifest, None))
    written += _update_dir(recipe_dir / str(number), [(f.path, (f, obj)) for f, obj in main], main_manifest,
                           set(old.get("files", {})), stat_cache, link_type, seal_main)
    return written


def _update_dir(version_dir: Path, listed: list[tuple[str, tuple[FileEntry, Path]]], manifest: bytes,
                previous: set[str], stat_cache: StatCache, link_type: str,
                finish: Callable[[Path], None] | None) -> list[Path]:
    """Make `version_dir` hold `listed` ((path, (entry, object))) and `manifest`. The
    manifest is the commit point: before it is renamed in, the version lists its old files
    (those deleted or replaced read as damaged, never as someone else's), after it the new
    ones (those not there yet read as missing, restored by the next build)."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=version_dir.parent))
    try:
        changed = []
        for rel, (entry, obj) in listed:
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            # Every copy checked against its entry, as versions.publish does: the object was
            # checked at its lookup, and whoever can write a shared cache can swap it since;
            # what is renamed in here is signed (model.sig) and published.
            if _holds(version_dir / rel, entry.hash, stat_cache):
                # Only for the statement and the signature: the version's own file stays.
                place_file(obj, path, "hardlink", durable=False, expect=entry.hash)
            else:  # a new report file, or a damaged model file: restored from its object
                place_file(obj, path, link_type, expect=entry.hash)
                changed.append(rel)
        with open(tmp / MANIFEST, "wb") as f:
            f.write(manifest)
            f.flush()
            os.fsync(f.fileno())
        if finish is not None:
            finish(tmp)
        entries = {rel: entry for rel, (entry, _) in listed}
        for rel in sorted(previous - set(entries)):  # report files the version no longer has
            _delete(version_dir / rel, version_dir)
        written = [_move(tmp, version_dir, rel) for rel in changed if rel in previous]
        for name in (PROVENANCE, SIGNATURE):
            if (tmp / name).exists():
                written.append(_move(tmp, version_dir, name))
            else:  # a signature the workspace no longer makes would not verify
                _delete(version_dir / name, version_dir)
        written.append(_move(tmp, version_dir, MANIFEST))
        written += [_move(tmp, version_dir, rel) for rel in changed if rel not in previous]
        for rel in changed:
            stat_cache.record(os.fspath(version_dir / rel), os.stat(version_dir / rel), entries[rel].hash)
        return written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move(tmp: Path, version_dir: Path, rel: str) -> Path:
    """Rename `tmp/rel` over `version_dir/rel`, durably."""
    dest = version_dir / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp / rel, dest)
    fsync_path(dest.parent)
    return dest


def _delete(path: Path, top: Path) -> None:
    """Delete a file tpubuild wrote in a version, then the directories it leaves empty."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    parent = path.parent
    while parent != top:
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = parent.parent
    fsync_path(parent)


def _holds(path: Path, digest: str, stat_cache: StatCache) -> bool:
    try:
        return not path.is_symlink() and stat_cache.file_hash(os.fspath(path)) == digest
    except OSError:
        return False
