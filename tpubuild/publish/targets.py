"""Target versions: `<output_dir>/<recipe>/<target>/<N>/` beside the main `<recipe>/<N>/`.

Each target a recipe lists besides the TPU SavedModel (`targets:`) is published in a
directory of its own with the main version's number N: `out/toy/cpu_savedmodel/3/` is
version 3's CPU SavedModel. TF Serving scans only numeric names, so `out/toy/` stays the
TPU SavedModel's base path, and `out/toy/cpu_savedmodel/` is a base path too.

The main version's manifest lists every target's files and digests; each target version
also holds a small `tpubuild-manifest.json` (recipe, target, version, files) so that
`clean` and pruning can prove a target directory is tpubuild's before deleting it.
Publishing (publish/versions.py) reserves the number, renames the main version into place,
then each target version (temp directory, fsync, rename): a target version's main version
always exists. A main version whose target version a killed publish left missing is
completed by the next build; a target version without its main version (an older
tpubuild's killed publish) is removed, its number never reused. In the publish step's
file list a target file is named `<target>/<path>`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from tpubuild.atomic import fsync_path
from tpubuild.digests import FileEntry
from tpubuild.fs import place_file
from tpubuild.pipeline import TARGET_PACKAGES

MANIFEST = "tpubuild-manifest.json"
VERSION_NAME = re.compile(r"0|[1-9][0-9]*")
# Directory names under `<recipe>/` that hold target versions.
TARGET_NAMES = tuple(TARGET_PACKAGES)


def split_by_target(files: list[Any], targets: list[str]) -> tuple[list[Any], dict[str, list[tuple[str, Any]]]]:
    """(main files, {target: [(path in the target version, item)]}) of the publish step's
    files (FileEntry, or (FileEntry, object) pairs), target files named `<target>/<path>`."""
    main: list[Any] = []
    by_target: dict[str, list[tuple[str, Any]]] = {t: [] for t in targets}
    for item in files:
        entry = item[0] if isinstance(item, tuple) else item
        head, _, rest = entry.path.partition("/")
        if head in by_target and rest:
            by_target[head].append((rest, item))
        else:
            main.append(item)
    return main, by_target


def target_manifest(manifest: dict[str, Any], target: str) -> dict[str, Any]:
    """The small manifest of a target version, derived from the main version's."""
    entry = manifest["targets"][target]
    # `sizes` only where the main manifest has them: a target version published before
    # them keeps the manifest it has (stale_manifests compares bytes).
    return {"recipe": manifest["recipe"], "target": target, "version": manifest["version"],
            "content": manifest["content"], "files": dict(entry["files"]),
            **({"sizes": dict(entry["sizes"])} if isinstance(entry.get("sizes"), dict) else {})}


def manifest_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def version_files(recipe_dir: Path, number: int | str, manifest: dict[str, Any]) -> Iterator[tuple[str, Path, str]]:
    """(name in the publish step, path, digest) of every file a main version lists:
    its own, then each target version's."""
    for rel, digest in sorted(manifest.get("files", {}).items()):
        yield rel, recipe_dir / str(number) / rel, digest
    for target, entry in sorted((manifest.get("targets") or {}).items()):
        for rel, digest in sorted(entry.get("files", {}).items()):
            yield f"{target}/{rel}", recipe_dir / target / str(number) / rel, digest


def stale_manifests(recipe_dir: Path, number: int | str, manifest: dict[str, Any]) -> list[str]:
    """Targets whose version directory lacks the manifest the main version implies."""
    stale = []
    for target in sorted(manifest.get("targets") or {}):
        path = recipe_dir / target / str(number) / MANIFEST
        try:
            if path.read_bytes() != manifest_bytes(target_manifest(manifest, target)):
                stale.append(target)
        except OSError:
            stale.append(target)
    return stale


def write_manifest(recipe_dir: Path, number: int | str, manifest: dict[str, Any], target: str) -> None:
    """Rewrite a target version's manifest in place (repair)."""
    from tpubuild.atomic import write_atomic

    directory = recipe_dir / target / str(number)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / MANIFEST, manifest_bytes(target_manifest(manifest, target)))


def write_version(target_dir: Path, number: int, files: list[tuple[str, tuple[FileEntry, Path]]],
                  manifest: dict[str, Any], link_type: str,
                  finish: Callable[[Path], None] | None = None) -> Path:
    """Write `<target_dir>/<number>/` atomically and durably; returns it. `finish(dir)`
    runs on the temp directory once its files and manifest are written, before the rename
    (the provenance statement and the signature, as for a main version)."""
    return commit_version(prepare_version(target_dir, files, manifest, link_type, finish), target_dir, number)


def prepare_version(target_dir: Path, files: list[tuple[str, tuple[FileEntry, Path]]], manifest: dict[str, Any],
                    link_type: str, finish: Callable[[Path], None] | None = None,
                    known: Callable[[os.stat_result], str | None] | None = None) -> Path:
    """A target version complete in a temp directory of `target_dir`, every file checked
    against its digest (fs/place.py place_file's `expect` and `known`), durable;
    `commit_version` renames it."""
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target_dir))
    try:
        made = {tmp}
        for rel, (entry, obj) in files:
            path = tmp / rel
            if path.parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(path.parent)
            place_file(obj, path, link_type, expect=entry.hash, known=known)
        with open(tmp / MANIFEST, "wb") as f:
            f.write(manifest_bytes(manifest))
            f.flush()
            os.fsync(f.fileno())
        if finish is not None:
            finish(tmp)
        os.chmod(tmp, 0o755)
        for directory in sorted(made, key=lambda p: -len(p.parts)):
            fsync_path(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def commit_version(tmp: Path, target_dir: Path, number: int) -> Path:
    """Rename a prepared target version into place as `<target_dir>/<number>/`."""
    try:
        os.rename(tmp, target_dir / str(number))
        fsync_path(target_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target_dir / str(number)


def is_version_name(name: str) -> bool:
    """Whether a directory name is a version number tpubuild writes: ASCII digits in their
    canonical spelling (`str(int(name)) == name`). `str.isdigit()` also accepts `²` (which
    int() refuses) and `١` (which int() reads as 1), and `01` would alias `1`: such names
    are the user's, left alone."""
    return VERSION_NAME.fullmatch(name) is not None


def numbers(target_dir: Path) -> list[int]:
    """The version numbers in `target_dir` (main or target): canonical ASCII-digit
    directory names (`is_version_name`); anything else there is not a version."""
    try:
        names = os.listdir(target_dir)
    except OSError:  # missing, or not a directory: publish reports it when it writes
        return []
    return sorted(int(n) for n in names if is_version_name(n) and (target_dir / n).is_dir())


def target_dirs(recipe_dir: Path) -> list[Path]:
    """The target directories present under `recipe_dir` (real directories, not links)."""
    return [recipe_dir / t for t in TARGET_NAMES if (recipe_dir / t).is_dir() and not (recipe_dir / t).is_symlink()]
