"""One recipe's publish to its destination (`publish_to:`): the local version `out/<recipe>/<L>/`
checked against its manifest, then, on the destination (publish/destination.py), what
killed jobs left finished or removed, nothing when the newest version there holds the
same model, else a number claimed, the version staged, checked, sealed and made visible,
saved_model.pb last. When the destination's number is not L, the manifests say the new
number and the provenance statement and signature are made anew for them.

A workspace notes what it published where (`record_path`): a build with nothing to do
then contacts no destination; a fresh clone has no note and asks the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpubuild.publish.dest_state import (
    OWN,
    STAGING,
    DestinationError,
    Outcome,
    Tree,
)
from tpubuild.publish.destination import Destination
from tpubuild.publish.targets import MANIFEST, manifest_bytes, target_manifest


# --- one recipe's publish ----------------------------------------------------------------
def budget_seconds(sizes: list[int], timeouts: Any) -> float:
    """The seconds a job gives itself from its claim to its seal: each file's upload
    deadline, a read back in CHUNK-sized calls, and its hashing."""
    from tpubuild.config.remote_url import Timeouts
    from tpubuild.digests import CHUNK

    timeouts = timeouts or Timeouts()
    per_file = sum(timeouts.upload_deadline(size) + timeouts.total * (1 + size // CHUNK) + size / (8 << 20)
                   for size in sizes)
    return 60.0 + timeouts.total * 4 + per_file


def local_trees(version_dir: Path, manifest: dict[str, Any], recipe: str, number: int
                ) -> list[tuple[Tree, Path, dict[str, str]]]:
    """The main version and each target version of a local published version, as trees to
    stage under `number`: (tree, local directory, {path: BLAKE3 its manifest lists})."""
    out = []
    listed = {"": manifest.get("files", {})}
    for target, entry in sorted((manifest.get("targets") or {}).items()):
        listed[target] = entry.get("files", {})
    for target, files in listed.items():
        local = version_dir if not target else version_dir.parent / target / version_dir.name
        final = f"{recipe}/{number}" if not target else f"{recipe}/{target}/{number}"
        staged = f"{recipe}/{STAGING}/{number}/" + ("version" if not target else f"targets/{target}")
        out.append((Tree(final, staged, {}), local, dict(files)))
    return out


def publish_version(dest: Destination, recipe: str, version_dir: Path, scratch: Path, *,
                    keep: int | None = None, pinned: set[int] | frozenset[int] = frozenset(),
                    attest: Callable[[Path, dict[str, Any], str | None], None] | None = None,
                    file_hash: Callable[[Path], str] | None = None,
                    say: Callable[[str], None] = lambda line: None) -> Outcome:
    """Publish the local version `version_dir` (`<out>/<recipe>/<L>/`, with its target
    versions) to `dest`: finish or remove what killed jobs left; nothing when the newest
    version there holds the same model; else claim a number, stage, check, seal, promote,
    unstage, prune. When the claimed number is not L, the manifests say the new number and
    `attest(dir, manifest, target)` writes the provenance statement and signature anew
    (without it, they are left out). `file_hash` checks the local files (the stat cache)."""
    from tpubuild.digests import hash_file

    file_hash = file_hash or hash_file
    try:
        manifest = json.loads((version_dir / MANIFEST).read_text())
        local_number = int(version_dir.name)
    except (OSError, ValueError) as exc:
        raise DestinationError(f"{version_dir}: not a published version ({exc})") from None
    dest.say = say  # what the destination holds that tpubuild leaves alone: a warning line each
    survey = dest.survey(recipe)
    mended = dest.mend(survey, say)
    if mended:
        survey = dest.survey(recipe)
    same = dest.newest_same_model(survey, manifest, scratch)
    if same is not None:
        return Outcome(dest.base_path(recipe), same, False, mended)
    planned = local_trees(version_dir, manifest, recipe, 0)
    sizes = []
    for _tree, local, files in planned:
        for rel, digest in sorted(files.items()):
            path = local / rel
            try:
                if file_hash(path) != digest:
                    raise DestinationError(f"{path}: differs from its {MANIFEST}; not published to {dest.url}")
                sizes.append(path.stat().st_size)
            except OSError as exc:
                raise DestinationError(f"{path}: {exc.strerror}; not published to {dest.url}") from None
    budget = budget_seconds(sizes, dest.timeouts)
    started = time.monotonic()
    number = dest.claim(survey, budget)
    deadline = started + budget
    scratch = Path(tempfile.mkdtemp(prefix="publish-", dir=scratch))
    try:
        trees = prepare_trees(recipe, version_dir, manifest, number, local_number, scratch, attest)
        dest.stage(trees, scratch, deadline)
        dest.seal(recipe, number, [t for t, _ in trees], deadline)
        dest.promote([t for t, _ in trees])
        dest.unstage(recipe, number)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        dest.say_left()
    pruned = dest.prune(dest.survey(recipe), keep, set(pinned), say) if keep else []
    return Outcome(dest.base_path(recipe), number, True, mended, pruned)


def prepare_trees(recipe: str, version_dir: Path, manifest: dict[str, Any], number: int, local_number: int,
                  scratch: Path, attest: Callable[..., None] | None) -> list[tuple[Tree, Path]]:
    """The trees to stage for version `number`, each with the local directory its files are
    read from: the local version itself when the numbers agree, else a copy (hard links)
    whose manifests say `number`, attested anew."""
    renumbered = dict(manifest, version=number)
    out = []
    for tree, local, files in local_trees(version_dir, manifest, recipe, number):
        target = tree.final.split("/")[1] if tree.final.count("/") == 2 else None
        source = local
        if number != local_number:
            source = scratch / (target or "version")
            source.mkdir(parents=True)
            for rel in files:
                (source / rel).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(local / rel, source / rel)
            data = renumbered if target is None else target_manifest(renumbered, target)
            (source / MANIFEST).write_bytes(manifest_bytes(data))
            if attest is not None:
                attest(source, renumbered, target)
        names = set(files) | {name for name in OWN if (source / name).is_file()}
        tree.files = {rel: ((source / rel).stat().st_size, _blake3(source / rel, files.get(rel))) for rel in names}
        out.append((tree, source))
    return out


def _blake3(path: Path, known: str | None) -> str:
    from tpubuild.digests import hash_file

    return known if known is not None else hash_file(path)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


# --- what this workspace knows the destination holds --------------------------------------
def record_path(state_dir: Path, url: str, recipe: str) -> Path:
    """Where a workspace notes that `url` holds a recipe's model: a no-op build then
    contacts no destination (and the no-op memo covers the note)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:24]
    return Path(state_dir) / "published" / digest / f"{recipe}.json"


def recorded(state_dir: Path, url: str, recipe: str, model: str | None) -> bool:
    try:
        data = json.loads(record_path(state_dir, url, recipe).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("model") == model and data.get("url") == url.rstrip("/")


def remember(state_dir: Path, url: str, recipe: str, model: str | None, number: int) -> None:
    from tpubuild.atomic import write_text_atomic

    url = url.rstrip("/")
    path = record_path(state_dir, url, recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"url": url, "recipe": recipe, "model": model, "version": number},
                                       sort_keys=True) + "\n")
