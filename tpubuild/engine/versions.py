"""Published versions: `<output_dir>/<recipe>/<N>/`, TF Serving's numbered layout.

A version is assembled in a hidden temp directory beside the numbered ones and renamed
into place, so the highest number (what TF Serving serves) is always complete. A new
number appears only when the content differs from the newest version's.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tpubuild.engine.hashing import FileEntry
from tpubuild.engine.statcache import StatCache
from tpubuild.engine.store import link_or_copy
from tpubuild.errors import StageError

MANIFEST = "tpubuild-manifest.json"


def version_numbers(recipe_dir: Path) -> list[int]:
    try:
        names = os.listdir(recipe_dir)
    except OSError:  # missing, or not a directory: publish reports it when it writes
        return []
    return sorted(int(n) for n in names if n.isdigit() and (recipe_dir / n).is_dir())


def read_manifest(version_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((version_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def intact(version_dir: Path, manifest: dict[str, Any], stat_cache: StatCache) -> bool:
    """Whether the files of a published version still have the content its manifest lists."""
    for rel, digest in manifest.get("files", {}).items():
        try:
            if stat_cache.file_hash(os.path.join(version_dir, rel)) != digest:
                return False
        except OSError:
            return False
    return True


def newest_matching(recipe_dir: Path, content: str, stat_cache: StatCache) -> int | None:
    """The newest version's number if it holds `content`, intact; else None."""
    numbers = version_numbers(recipe_dir)
    if not numbers:
        return None
    version_dir = recipe_dir / str(numbers[-1])
    manifest = read_manifest(version_dir)
    if manifest and manifest.get("content") == content and intact(version_dir, manifest, stat_cache):
        return numbers[-1]
    return None


def publish(
    recipe_dir: Path,
    files: list[tuple[FileEntry, Path]],
    manifest: dict[str, Any],
    keep: int | None,
    stat_cache: StatCache | None = None,
) -> int:
    """Write a new version from (entry, object path) pairs and the manifest; returns N."""
    try:
        recipe_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=recipe_dir))
    except OSError as exc:
        raise StageError(f"cannot write the output directory {recipe_dir}: {exc.strerror}") from None
    try:
        for entry, obj in files:
            target = tmp / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(obj, os.fspath(target))
        number = (version_numbers(recipe_dir) or [0])[-1] + 1
        manifest = dict(manifest, version=number)
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        os.rename(tmp, recipe_dir / str(number))
        if stat_cache is not None:  # hardlinks of objects whose hashes are known
            for entry, _ in files:
                path = os.path.join(recipe_dir, str(number), entry.path)
                stat_cache.record(path, os.stat(path), entry.hash)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while publishing to {recipe_dir}") from None
        raise StageError(f"cannot write the output directory {recipe_dir}: {exc.strerror}") from None
    if keep:
        prune(recipe_dir, keep)
    return number


def prune(recipe_dir: Path, keep: int) -> list[int]:
    """Remove all but the newest `keep` versions: renamed away first, so never half-deleted."""
    removed = []
    for number in version_numbers(recipe_dir)[:-keep]:
        trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=recipe_dir))
        os.rename(recipe_dir / str(number), trash / "v")
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(number)
    return removed


def clean_temp(recipe_dir: Path) -> None:
    """Drop the hidden temp directories a killed build left in `recipe_dir`."""
    try:
        names = os.listdir(recipe_dir)
    except OSError:
        return
    for name in names:
        if name.startswith((".tmp-", ".trash-")):
            shutil.rmtree(recipe_dir / name, ignore_errors=True)
