"""One recipe's publish to an oci:// destination (publish/oci_destination.py): the local
version `out/<recipe>/<L>/` checked against its manifest; nothing when the newest version
in the registry holds the same model (by its bytes: the registry names each blob by its
sha256, which it checked when it took the blob, so a layer whose digest is the sha256 of
the local file holds that file); else a number claimed, each target version pushed, then
the recipe's (its manifest, the tag N, last: the commit point), every file hashed as it
is read for the push (BLAKE3 against the manifest, sha256 for the registry, in one
reading), then pruning. When the registry's number is not L, the manifests say the new
number and the provenance statement and signature are made anew (publish/to_destination.py
prepare_trees, as for a bucket).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpubuild.publish.dest_state import OWN, DestinationError, Outcome, Tree
from tpubuild.publish.dest_survey import all_files, model_files
from tpubuild.publish.oci_destination import OciDestination, OciSurvey, OciVersion
from tpubuild.publish.oci_format import (
    CREATED,
    FILEPATH,
    BaseImage,
    LAYER_ROLE,
    LocalFile,
    TarLayer,
    modelcar,
    modelpack,
    version_time,
)
from tpubuild.publish.targets import MANIFEST
from tpubuild.publish.to_destination import local_trees, prepare_trees


def describes(rel: str) -> bool:
    """Whether a version's file describes it rather than being its model: the manifest,
    provenance and signature, and the report's files (figures measured on the building
    machine: what the manifest's `model` digest leaves out)."""
    from tpubuild.report.formats import REPORT_JSON, REPORT_MD
    from tpubuild.stages.report import HLO_DIR

    return rel in OWN or rel in (REPORT_JSON, REPORT_MD) or rel.startswith(f"{HLO_DIR}/")


def publish_oci_version(dest: OciDestination, recipe: str, version_dir: Path, scratch: Path, *,
                        keep: int | None = None, pinned: set[int] | frozenset[int] = frozenset(),
                        attest: Callable[[Path, dict[str, Any], str | None], None] | None = None,
                        file_hash: Callable[[Path], str] | None = None,
                        say: Callable[[str], None] = lambda line: None) -> Outcome:
    """Publish the local version `version_dir` (with its target versions) to `dest`."""
    from tpubuild.digests import hash_file

    file_hash = file_hash or hash_file
    try:
        manifest = json.loads((version_dir / MANIFEST).read_text())
        local_number = int(version_dir.name)
    except (OSError, ValueError) as exc:
        raise DestinationError(f"{version_dir}: not a published version ({exc})") from None
    dest.say = say
    for _tree, local, files in local_trees(version_dir, manifest, recipe, 0):
        for rel, digest in sorted(files.items()):
            path = local / rel
            try:
                if file_hash(path) != digest:
                    raise DestinationError(f"{path}: differs from its {MANIFEST}; not published to {dest.url}")
            except OSError as exc:
                raise DestinationError(f"{path}: {exc.strerror}; not published to {dest.url}") from None
    survey = dest.survey(recipe)
    base = dest.base_image()  # before the claim: a base that is not there costs no number
    same = newest_same_model(dest, survey, manifest, version_dir, base)
    if same is not None:
        return Outcome(dest.base_path(recipe), same, False)
    number, survey = dest.claim(survey)
    work = Path(tempfile.mkdtemp(prefix="publish-", dir=scratch))
    try:
        trees = prepare_trees(recipe, version_dir, manifest, number, local_number, work, attest)
        # The targets' versions first, the recipe's last: its tag is what says version N is there.
        for tree, source in sorted(trees, key=lambda t: _target(t[0]) is None):
            push_tree(dest, recipe, number, _target(tree), tree, source, base)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pruned = dest.prune(dest.survey(recipe), keep, set(pinned), say) if keep else []
    return Outcome(dest.base_path(recipe), number, True, [], pruned)


def _target(tree: Tree) -> str | None:
    parts = tree.final.split("/")
    return parts[1] if len(parts) == 3 else None


def push_tree(dest: OciDestination, recipe: str, number: int, target: str | None, tree: Tree, source: Path,
              base: Any = None) -> str:
    """One version directory (`tree`, its files at `source`) as version `number` of the
    recipe's repository (a target's, with `target`), in the destination's format."""
    from tpubuild.provenance.digests import blake3_and_sha256
    from tpubuild.transport import sha256_digest

    try:
        described = json.loads((source / MANIFEST).read_bytes())
        manifest_digest = sha256_digest((source / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise DestinationError(f"{source / MANIFEST}: unreadable ({exc}); not published to {dest.url}") from None
    seconds = version_time(described)
    blake3 = {rel: digest for rel, (_size, digest) in tree.files.items()}
    if dest.format == "modelpack":
        files = []
        for rel, (size, digest) in sorted(tree.files.items()):
            path = source / rel
            try:
                got, sha = blake3_and_sha256(path)
            except OSError as exc:
                raise DestinationError(f"{path}: {exc.strerror}; not published to {dest.url}") from None
            if got != digest or path.stat().st_size != size:
                raise DestinationError(f"{path}: changed while it was published (not what its manifest lists); "
                                       f"not published to {dest.url}")
            files.append(LocalFile(rel, path, size, sha))
        revision = described.get("git_commit") if isinstance(described.get("git_commit"), str) else None
        config, layers, body = modelpack(recipe, number, files, seconds, manifest_digest, revision)
        return dest.push(recipe, number, target, config, layers, body)
    model = [LocalFile(rel, source / rel, size, "") for rel, (size, _) in tree.files.items() if not describes(rel)]
    about = [LocalFile(rel, source / rel, size, "") for rel, (size, _) in tree.files.items() if describes(rel)]
    try:
        config, layers, body = modelcar(recipe, number, model, about, seconds, manifest_digest, base, blake3)
    except OSError as exc:
        raise DestinationError(f"{exc}; not published to {dest.url}") from None
    return dest.push(recipe, number, target, config, layers, body, base)


# --- does the newest version hold this model? ----------------------------------------------
def newest_same_model(dest: OciDestination, survey: OciSurvey, manifest: dict[str, Any], version_dir: Path,
                      base: BaseImage | None = None) -> int | None:
    """The newest version's number when it holds the model of the local `manifest`
    (`version_dir`): a version of the destination's format whose tpubuild-manifest.json,
    read back by the digest its manifest names, names the recipe and the same `model` and
    model files, and whose layers hold exactly the local model files' bytes (a ModelPack
    layer's digest is the file's sha256; a modelcar's model layer is the tar the local
    files make for that number and time, on the layers of `base`, the base image now).
    Else None, with a warning when its manifest claims this model and its layers are
    other bytes."""
    numbers = survey.complete_numbers()
    if not numbers:
        return None
    number, recipe = numbers[-1], survey.recipe
    version = dest.version(recipe, number)
    if version is None or version.format != dest.format:
        return None
    theirs = dest.description(recipe, version, number)
    if not theirs or theirs.get("model") != manifest.get("model") or theirs.get("recipe") != recipe:
        return None
    wanted, listed = model_files(manifest), model_files(theirs)
    where = dest.version_url(recipe, number)
    if wanted is None or listed is None or listed != wanted:
        dest.warn(f"{where} does not hold what its manifest says (its files are not this model's); a new version "
                  "is published")
        return None
    below = [layer["digest"] for layer in (base.layers if base else [])]
    if dest.format == "modelcar" and [layer["digest"] for layer in version.layers[:-2]] != below:
        return None  # another base image (or none): the image is another, the model the same
    why = _layers_differ(dest, recipe, number, version, theirs, wanted, version_dir)
    if why is not None:
        dest.warn(f"{where} does not hold what its manifest says ({why}); a new version is published")
        return None
    return number


def _layers_differ(dest: OciDestination, recipe: str, number: int, main: OciVersion, theirs: dict[str, Any],
                   wanted: dict[str, str], version_dir: Path) -> str | None:
    from tpubuild.provenance.digests import blake3_and_sha256

    by_target: dict[str, list[str]] = {}
    for key in wanted:
        target, _, rel = key.partition("\0")
        by_target.setdefault(target, []).append(rel)
    everything = all_files(theirs) or {}
    for target, rels in sorted(by_target.items()):
        version = main if not target else dest.version(recipe, number, target)
        where = dest.version_url(recipe, number, target or None)
        if version is None or version.format != dest.format:
            return f"{where} is missing"
        local = version_dir if not target else version_dir.parent / target / version_dir.name
        listed = {key.partition("\0")[2] for key in everything if key.partition("\0")[0] == target}
        if dest.format == "modelpack":
            paths = [str((d.get("annotations") or {}).get(FILEPATH)) for d in version.layers]
            if sorted(paths) != sorted(listed | {rel for rel in OWN if rel in paths}) or len(set(paths)) != len(paths):
                return f"{where} holds other files than its {MANIFEST} lists"
            for rel in sorted(rels):
                layer = version.layer_with(FILEPATH, rel)
                try:
                    _b3, sha = blake3_and_sha256(local / rel)
                except OSError:
                    return f"{local / rel} is unreadable"
                if layer is None or layer["digest"] != f"sha256:{sha}":
                    return f"{where}: {rel} is other bytes"
        else:
            layer = version.layer_with(LAYER_ROLE, "model")
            seconds = _seconds(version.annotations.get(CREATED))
            if layer is None or seconds is None:
                return f"{where} has no model layer tpubuild made"
            files = [LocalFile(rel, local / rel, (local / rel).stat().st_size, "") for rel in rels]
            if TarLayer(number, files, seconds).digest != layer["digest"]:
                return f"{where}: its model layer is other bytes"
    return None


def _seconds(stamp: str | None) -> int | None:
    import calendar
    import time

    try:
        return calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None
