"""Published versions: `<output_dir>/<recipe>/<N>/`, TF Serving's numbered layout.

A version is assembled in a hidden temp directory beside the numbered ones, fsynced and
renamed into place, so the highest number (what TF Serving serves) is always complete.
A new number appears only when the model differs from the newest version's: its files,
the report's aside (a manifest's `model` digest). A build that re-measured the same model
(new verification figures, latencies, report) updates the newest version's report,
manifest and provenance in place instead (publish/refresh.py).

Publishing modes (workspace `link_type`):
- `hardlink` (default): each file is a hard link to the cache object where the file
  system allows it (the same file system, an object this user owns; else a copy, as
  fs/place.py place_file decides): no byte written twice (issue 54: publishing an 8 GiB
  model's 4 GiB bfloat16 artifact copied and fsynced 4 GiB, 6.05 s of a 61.1 s build),
  no extra space. The cache object and every published file with the same content are
  one read-only inode: a damaged file is detected at the next build (its stat changes,
  so it is rehashed) and restored in place from a rebuilt object.
- `copy`: each file is a reflink of the cache object where the file system supports it
  (btrfs, XFS, ...), else a copy. Either way it is its own inode: writing into
  `out/alpha/1/x` (even as root, or after `chmod u+w`) can change neither the cache nor
  another recipe's or version's files.

What tpubuild deletes (`clean`, pruning): only a directory `<recipe>/<N>/` holding a
`tpubuild-manifest.json` that names that recipe and lists exactly the files there.
Anything else in the output directory is the user's: it is left and reported.

Version numbers are never reused in a directory: the number is reserved (the highest ever
used, in `.tpubuild/versions/` of the workspace, written durably) before any directory of
that number is renamed into place, so a publish killed at any point burns its number, and
`clean` does not reset it.

Targets (recipe `targets:`): each other target of version N is published at
`<recipe>/<target>/<N>/` (publish/targets.py); the main manifest lists their files
too, so the no-op check, repair, pruning and `clean` cover them. Order: the main `<N>/`
is renamed into place first, each target version after it; pruning and `clean` delete in
the opposite order. So at every instant a target version's main version exists (a TF
Serving model server watching `<recipe>/<target>/` never loads a version that the main
base path never had), and what a killed publish leaves is a main version missing a target
version, which the next build restores (whole, by a rename) before it trusts the version.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tpubuild import progress
from tpubuild.atomic import fsync_path, write_text_atomic
from tpubuild.digests import FileEntry, StatCache, hash_file
from tpubuild.errors import StageError
from tpubuild.fs import place_file, replace_file
from tpubuild.provenance.statement import PROVENANCE, SIGNATURE
from tpubuild.publish import targets as target_versions
from tpubuild.publish.targets import MANIFEST

# Files of a main version that its manifest does not list because they describe it.
OWN_FILES = frozenset({MANIFEST, PROVENANCE, SIGNATURE})

version_numbers = target_versions.numbers  # the same rule for `<recipe>/N` and `<recipe>/<target>/N`


def read_manifest(version_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((version_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def damaged_files(version_dir: Path, manifest: dict[str, Any], stat_cache: StatCache) -> list[str]:
    """The files of a published version (its target versions' too, named `<target>/<path>`)
    whose content is not what its manifest lists."""
    bad = []
    for name, path, digest in target_versions.version_files(version_dir.parent, version_dir.name, manifest):
        try:
            if stat_cache.file_hash(os.fspath(path)) != digest:
                bad.append(name)
        except OSError:
            bad.append(name)
    return bad


def foreign_entries(recipe_dir: Path, number: int | str, manifest: dict[str, Any]) -> list[str]:
    """What a version (and each of its target versions) holds that tpubuild did not write:
    a symbolic link anywhere in it, or a file its manifest does not list."""
    dirs = {".": (recipe_dir / str(number), set(manifest.get("files", {})))}
    for target, entry in sorted((manifest.get("targets") or {}).items()):
        dirs[target] = (recipe_dir / target / str(number), set(entry.get("files", {})))
    found = []
    for label, (version_dir, listed) in dirs.items():
        prefix = "" if label == "." else f"{label}/"
        if version_dir.is_symlink():
            found.append(f"{prefix}{version_dir.name} (a symbolic link)")
            continue
        for dirpath, dirnames, filenames in os.walk(version_dir):  # never follows links
            rel_dir = os.path.relpath(dirpath, version_dir)
            for name in dirnames + filenames:
                rel = name if rel_dir == "." else Path(rel_dir, name).as_posix()
                if os.path.islink(os.path.join(dirpath, name)):
                    found.append(f"{prefix}{rel} (a symbolic link)")
                elif name in filenames and rel not in listed and rel not in OWN_FILES:
                    found.append(f"{prefix}{rel}")
    return sorted(found)


def check_manifest(version_dir: Path) -> list[str]:
    """Problems of one version directory (a main or a target version) against its own
    manifest, for `tpubuild verify`: publish/version_check.py (names checked, nothing
    followed, sizes before hashes). Read-only."""
    from tpubuild.publish.version_check import check_version

    return check_version(Path(version_dir)).problems


def foreign_in_newest(recipe_dir: Path) -> list[str]:
    """foreign_entries of the newest version, if it has a readable manifest."""
    numbers = version_numbers(recipe_dir)
    manifest = read_manifest(recipe_dir / str(numbers[-1])) if numbers else None
    return foreign_entries(recipe_dir, numbers[-1], manifest) if manifest else []


def intact(version_dir: Path, manifest: dict[str, Any], stat_cache: StatCache) -> bool:
    """Whether the files of a published version still have the content its manifest lists."""
    return not damaged_files(version_dir, manifest, stat_cache)


@dataclass(frozen=True)
class Holding:
    """The newest version of a recipe, which holds a given content: what in it is damaged
    (files whose content is not its manifest's) and which target versions are missing or
    lack their manifest. Told by `newest_holding`, a query; mended by `repair_newest`."""

    number: int
    damaged: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()

    @property
    def intact(self) -> bool:
        return not self.damaged and not self.stale


def newest_holding(recipe_dir: Path, content: str, stat_cache: StatCache) -> Holding | None:
    """The newest version when it holds `content` (intact or damaged), else None. A query:
    nothing is written (planning and dry runs ask it; a build then repairs, `repair_newest`)."""
    numbers = version_numbers(recipe_dir)
    if not numbers:
        return None
    version_dir = recipe_dir / str(numbers[-1])
    manifest = read_manifest(version_dir)
    if not manifest or manifest.get("content") != content:
        return None
    if foreign_entries(recipe_dir, numbers[-1], manifest):
        # Never repaired in place: a repair would write through a link into the user's
        # files, and deleting what the user put there is not tpubuild's to do. A new
        # version is published beside it; pruning leaves it (not_published_reason).
        return None
    return Holding(numbers[-1], tuple(damaged_files(version_dir, manifest, stat_cache)),
                   tuple(target_versions.stale_manifests(recipe_dir, numbers[-1], manifest)))


def newest_matching(recipe_dir: Path, content: str, stat_cache: StatCache) -> int | None:
    """The newest version's number if it holds `content`, intact; else None. A query."""
    holding = newest_holding(recipe_dir, content, stat_cache)
    return holding.number if holding is not None and holding.intact else None


def repair_newest(recipe_dir: Path, holding: Holding, files: list[tuple[FileEntry, Path]], stat_cache: StatCache,
                  link_type: str = "copy") -> list[Path] | None:
    """Make the newest version `holding` describes intact again from `files` ((entry,
    verified object path) pairs of its content): each damaged file replaced (fresh copy or
    link + rename, checked), a missing target version written whole, a missing target
    manifest written. Returns the paths written, or None, writing nothing, when `files`
    lack one it needs (publish a new version instead)."""
    manifest = read_manifest(recipe_dir / str(holding.number)) or {}
    objects = {entry.path: (entry, obj) for entry, obj in files}
    if any(rel not in objects for rel in holding.damaged):
        return None
    number = holding.number
    paths = {name: path for name, path, _ in target_versions.version_files(recipe_dir, number, manifest)}
    bad = list(holding.damaged)
    restored: list[Path] = []
    rewritten = set()
    for target in holding.stale:
        if os.path.lexists(recipe_dir / target / str(number)):
            continue
        listed = [(rel, objects[f"{target}/{rel}"]) for rel in manifest["targets"][target].get("files", {})]
        if any(f"{target}/{rel}" not in objects for rel in manifest["targets"][target].get("files", {})):
            return None
        rewritten.add(target)
        # A publish killed between the main version and this target version: the target
        # version appears whole, by a rename, as publish writes it.
        written = target_versions.write_version(recipe_dir / target, number, listed,
                                                target_versions.target_manifest(manifest, target), link_type)
        for rel, (entry, _) in listed:
            stat_cache.record(os.fspath(written / rel), os.stat(written / rel), entry.hash)
        bad = [name for name in bad if not name.startswith(f"{target}/")]
        restored += [written / rel for rel, _ in listed] + [written / MANIFEST]
    for target in sorted(set(holding.stale) - rewritten):  # a target version's own manifest: what `clean` trusts
        target_versions.write_manifest(recipe_dir, number, manifest, target)
        restored.append(recipe_dir / target / str(number) / MANIFEST)
    for rel in bad:
        entry, obj = objects[rel]
        paths[rel].parent.mkdir(parents=True, exist_ok=True)  # a deleted target version is rebuilt in place
        replace_file(obj, paths[rel], link_type, expect=entry.hash)
        stat_cache.record(os.fspath(paths[rel]), os.stat(paths[rel]), entry.hash)
        restored.append(paths[rel])
    return restored


def newest_same_model(recipe_dir: Path, model: str) -> int | None:
    """The newest version's number when it holds the model whose digest is `model` (its
    manifest's `model`: every file but the report's, target files included) and nothing
    tpubuild did not write; else None. A query: nothing is written (the build's publish
    step updates that version in place, publish/refresh.py)."""
    numbers = version_numbers(recipe_dir)
    if not numbers:
        return None
    manifest = read_manifest(recipe_dir / str(numbers[-1]))
    if not manifest or manifest.get("model") != model or manifest.get("recipe") != recipe_dir.name:
        return None
    if foreign_entries(recipe_dir, numbers[-1], manifest):
        return None  # as in newest_matching: a new version is published beside it
    return numbers[-1]


def publish(
    recipe_dir: Path,
    files: list[tuple[FileEntry, Path]],
    manifest: dict[str, Any],
    keep: int | None,
    stat_cache: StatCache | None = None,
    link_type: str = "copy",
    warn: Callable[[str], None] | None = None,
    finish: Callable[[Path, dict[str, Any], str | None], None] | None = None,
    reservation: Path | None = None,
    known: Callable[[os.stat_result], str | None] | None = None,
) -> int:
    """Write a new version from (entry, object path) pairs and the manifest; returns N.
    `link_type`: "hardlink" (a link where the file system allows, the workspace default) or "copy" (reflink or copy) (module docstring).
    Files named `<target>/<path>` for a target in `manifest["targets"]` go to the target
    version `<recipe>/<target>/<N>/`, written after the main version. `finish(dir,
    manifest, target)` runs on each version's temp directory (the main one's with target
    None) once its files and manifest are written, before the rename: it adds the
    provenance statement and the signature. `reservation` (`reservation_file`) keeps the
    highest number ever used across crashes; without it only the directories present do.
    `known`: the objects this process hashed itself (fs/place.py place_file)."""
    targets = sorted(manifest.get("targets") or {})
    files, target_files = target_versions.split_by_target(files, targets)
    try:
        recipe_dir.mkdir(parents=True, exist_ok=True)
        number = reserve_number(recipe_dir, reservation)  # before anything is renamed, and before orphans go
        remove_orphans(recipe_dir, warn)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=recipe_dir))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while publishing to {recipe_dir}") from None
        raise StageError(f"cannot write the output directory {recipe_dir}: {exc.strerror}") from None
    written: list[Path] = []
    prepared: list[Path] = []  # target versions complete in temp directories
    try:
        manifest = dict(manifest, version=number)
        made = {tmp}
        # On a terminal, a large version's copy shows its bytes done and rate (progress.py).
        with progress.meter(f"publishing {recipe_dir.name} version {number}", sum(e.size for e, _ in files)):
            for entry, obj in files:
                target = tmp / entry.path
                if target.parent not in made:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    made.add(target.parent)
                place_file(obj, target, link_type, expect=entry.hash, known=known)  # the bytes published are checked
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if finish is not None:
            finish(tmp, manifest, None)
        os.chmod(tmp, 0o755)
        for directory in sorted(made, key=lambda p: -len(p.parts)):
            fsync_path(directory)
        # Every target version is written and checked before anything is renamed: a file
        # that does not hash as its manifest says fails the publish while nothing is visible.
        for target in targets:
            sealed = None if finish is None else (lambda d, t=target: finish(d, manifest, t))
            prepared.append(target_versions.prepare_version(recipe_dir / target, target_files[target],
                                                            target_versions.target_manifest(manifest, target),
                                                            link_type, sealed, known))
        # The main version first, each target version after it (module docstring: a reader
        # never sees a target version whose main version does not exist).
        os.rename(tmp, recipe_dir / str(number))
        fsync_path(recipe_dir)
        written.append(recipe_dir / str(number))
        for target, staged in zip(targets, prepared):
            written.append(target_versions.commit_version(staged, recipe_dir / target, number))
        if stat_cache is not None:  # files whose hashes are known
            for entry, _ in files:
                path = os.path.join(recipe_dir, str(number), entry.path)
                stat_cache.record(path, os.stat(path), entry.hash)
            for target in targets:
                for rel, (entry, _) in target_files[target]:
                    path = os.path.join(recipe_dir, target, str(number), rel)
                    stat_cache.record(path, os.stat(path), entry.hash)
    except (OSError, StageError) as exc:
        for directory in [tmp, *prepared]:  # those renamed into place are gone from there
            shutil.rmtree(directory, ignore_errors=True)
        for directory in reversed(written):  # target versions, then their main version; the number stays used
            _delete(directory)
        if isinstance(exc, StageError):
            raise
        if exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while publishing to {recipe_dir}") from None
        raise StageError(f"cannot write the output directory {recipe_dir}: {exc.strerror}") from None
    if keep:
        prune(recipe_dir, keep, warn)
    return number


def reservation_file(state_dir: Path, recipe_dir: Path) -> Path:
    """Where the workspace records the highest version number ever reserved in
    `recipe_dir`: `<state_dir>/versions/<sha256 of its real path>` (in the workspace, not
    in the output directory, whose listing is the user's and TF Serving's)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(recipe_dir))).hexdigest()[:32]
    return Path(state_dir) / "versions" / digest


def reserve_number(recipe_dir: Path, reservation: Path | None) -> int:
    """The next version number of `recipe_dir`: one more than every main or target version
    present and than the highest number ever reserved there (`reservation`, written
    durably before any directory of that number appears). A publish killed at any point
    leaves its number used, so no later publish gives other bytes that number: TF Serving
    (tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc) polls the
    base path for numeric child directories and aspires versions by number; a number it
    has loaded is not loaded again when its directory is replaced."""
    used = [*version_numbers(recipe_dir), *(n for t in target_versions.target_dirs(recipe_dir)
                                            for n in target_versions.numbers(t))]
    if reservation is not None:
        try:
            text = reservation.read_text().split("\n", 1)[0].strip()
            used.append(int(text) if target_versions.is_version_name(text) else 0)
        except OSError:
            pass  # never published there, or removed by hand: the directories say what was used
    number = max([0, *used]) + 1
    if reservation is not None:
        reservation.parent.mkdir(parents=True, exist_ok=True)
        # The number, then the directory it is for (for whoever reads the file). Fsynced, with its directory.
        write_text_atomic(reservation, f"{number}\n{os.path.realpath(recipe_dir)}\n")
    return number


def published_versions(output_dir: Path) -> list[Path]:
    """Every `<output_dir>/<recipe>/<N>/` whose manifest names that recipe."""
    found = []
    for name in sorted(os.listdir(output_dir)) if output_dir.is_dir() else []:
        recipe_dir = output_dir / name
        for number in version_numbers(recipe_dir):
            manifest = read_manifest(recipe_dir / str(number))
            if manifest is not None and manifest.get("recipe") == name:
                found.append(recipe_dir / str(number))
    return found


def repair_version(version_dir: Path, object_path: Callable[[str], Path], link_type: str = "copy"
                   ) -> tuple[list[Path], list[Path]]:
    """Rehash every file of a published version against its manifest (whatever its stat
    says); restore a damaged one from its object when the object exists (the caller
    verified the objects). Returns (restored, damaged and not restorable)."""
    manifest = read_manifest(version_dir) or {}
    restored, lost = [], []
    for _, path, digest in target_versions.version_files(version_dir.parent, version_dir.name, manifest):
        try:
            if hash_file(path) == digest:
                continue
        except OSError:
            pass
        obj = object_path(digest)
        try:
            replace_file(obj, path, link_type, expect=digest)
            restored.append(path)
        except (OSError, StageError):  # no such object, or one that changed since it was checked
            lost.append(path)
    return restored, lost


def not_published_reason(version_dir: Path, recipe: str, target: str | None = None) -> str | None:
    """None when `version_dir` is a version tpubuild published for `recipe` (its manifest
    names the recipe, and `target` for a target version, and lists exactly the files
    there); else why it is not."""
    if version_dir.is_symlink() or not version_dir.is_dir():
        return "not a directory tpubuild published"
    manifest = read_manifest(version_dir)
    if manifest is None:
        return f"no readable {MANIFEST}"
    if manifest.get("recipe") != recipe:
        return f"its {MANIFEST} is for recipe {manifest.get('recipe')!r}, not {recipe!r}"
    if manifest.get("target") != target:
        return f"its {MANIFEST} is for target {manifest.get('target')!r}, not {target!r}"
    listed = set(manifest.get("files", {}))
    present = set()
    for dirpath, dirnames, filenames in os.walk(version_dir):
        rel_dir = os.path.relpath(dirpath, version_dir)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            present.add(name if rel_dir == "." else Path(rel_dir, name).as_posix())
    present -= OWN_FILES  # the files that describe the version (a target version has its statement and signature too)
    if present != listed:
        extra = sorted(present - listed)
        what = f"files its {MANIFEST} does not list ({', '.join(extra[:3])})" if extra else \
            f"fewer files than its {MANIFEST} lists"
        return f"holds {what}"
    return None


def _delete(path: Path) -> None:
    """Rename away first, then delete: a killed command never leaves half a version."""
    trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=path.parent))
    os.rename(path, trash / "v")
    shutil.rmtree(trash, ignore_errors=True)


def prune(recipe_dir: Path, keep: int, warn: Callable[[str], None] | None = None) -> list[int]:
    """Remove all but the newest `keep` versions tpubuild published; a numbered directory
    that is not one of them is left (and reported through `warn`)."""
    removed = []
    for number in version_numbers(recipe_dir)[:-keep]:
        version_dir = recipe_dir / str(number)
        reason = not_published_reason(version_dir, recipe_dir.name)
        if reason is not None:
            if warn is not None:
                warn(f"{version_dir}: {reason}; left in place")
            continue
        _delete_target_versions(recipe_dir, number, warn)  # target versions first: the opposite of publish's order
        _delete(version_dir)
        removed.append(number)
    return removed


def _delete_target_versions(recipe_dir: Path, number: int, warn: Callable[[str], None] | None) -> list[Path]:
    """Delete the target versions `<recipe>/<target>/<number>/` tpubuild published."""
    removed = []
    for target_dir in target_versions.target_dirs(recipe_dir):
        path = target_dir / str(number)
        if not os.path.lexists(path):
            continue
        reason = not_published_reason(path, recipe_dir.name, target_dir.name)
        if reason is not None:
            if warn is not None:
                warn(f"{path}: {reason}; left in place")
            continue
        _delete(path)
        removed.append(path)
    return removed


def remove_orphans(recipe_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Delete target versions whose main version does not exist (a killed publish)."""
    main = set(version_numbers(recipe_dir))
    removed = []
    for target_dir in target_versions.target_dirs(recipe_dir):
        clean_temp(target_dir)
        for number in target_versions.numbers(target_dir):
            path = target_dir / str(number)
            if number not in main and not_published_reason(path, recipe_dir.name, target_dir.name) is None:
                _delete(path)
                removed.append(path)
    return removed


def remove_published(recipe_dir: Path, recipe: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """`tpubuild clean`: delete the versions of `recipe` in `recipe_dir`, then the directory
    when nothing else is left. Returns (paths removed, [(path left, why)])."""
    removed: list[Path] = []
    left: list[tuple[Path, str]] = []
    if recipe_dir.is_symlink() or not recipe_dir.is_dir():
        if os.path.lexists(recipe_dir):
            left.append((recipe_dir, "not a directory tpubuild published"))
        return removed, left
    names = sorted(os.listdir(recipe_dir))
    reasons = {name: not_published_reason(recipe_dir / name, recipe) for name in names
               if target_versions.is_version_name(name)}
    target_reasons = {path / str(n): not_published_reason(path / str(n), recipe, path.name)
                      for path in target_versions.target_dirs(recipe_dir) for n in target_versions.numbers(path)}
    if None not in reasons.values() and None not in target_reasons.values():  # nothing here is ours
        left.append((recipe_dir, f"holds no version tpubuild published for recipe {recipe!r}"))
        return removed, left
    clean_temp(recipe_dir)
    handled = target_versions.target_dirs(recipe_dir)
    for target_dir in handled:  # target versions first: the opposite of publish's order
        gone, kept = _remove_target_dir(target_dir, target_reasons)
        removed += gone
        left += kept
    gone, kept = _remove_entries(recipe_dir, lambda path: reasons.get(path.name, NOT_PUBLISHED),
                                 skip=set(handled))  # what is left in a target directory was reported above
    removed += gone
    left += kept
    if not left:
        try:
            os.rmdir(recipe_dir)
            removed = [recipe_dir]
        except OSError:
            pass
    return removed, left


def _remove_target_dir(target_dir: Path, reasons: dict[Path, str | None]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """`clean` of one `<recipe>/<target>/`: its versions tpubuild published, then the
    directory when nothing else is left in it."""
    clean_temp(target_dir)
    removed, left = _remove_entries(target_dir, lambda path: reasons.get(path, NOT_PUBLISHED))
    if not left:
        try:
            os.rmdir(target_dir)
        except OSError as exc:
            left.append((target_dir, f"cannot remove it: {exc.strerror}"))
    return removed, left


NOT_PUBLISHED = "not a version tpubuild published"


def _remove_entries(directory: Path, reason: Callable[[Path], str | None],
                    skip: set[Path] | frozenset[Path] = frozenset()) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Delete each entry of `directory` for which `reason` is None (a version tpubuild
    published); leave the others, each with why. `clean`'s one loop, for a recipe's
    directory and for each of its target directories. Returns (removed, [(left, why)])."""
    removed: list[Path] = []
    left: list[tuple[Path, str]] = []
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if path in skip:
            continue
        why = reason(path)
        if why is not None:
            left.append((path, why))
            continue
        _delete(path)
        removed.append(path)
    return removed, left


def clean_temp(recipe_dir: Path) -> None:
    """Drop the hidden temp directories a killed build left in `recipe_dir`."""
    try:
        names = os.listdir(recipe_dir)
    except OSError:
        return
    for name in names:
        if name.startswith((".tmp-", ".trash-")):
            shutil.rmtree(recipe_dir / name, ignore_errors=True)
