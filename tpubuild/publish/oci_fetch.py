"""`tpubuild verify oci://HOST[:PORT]/REPO/<recipe>[/<target>]:<N>`: a version in an OCI
registry pulled into verify's own temporary directory, then checked there as a local
one (commands/verify.py, publish/version_check.py).

A registry is written by many (docs/publish-to-oci.md "Trust model"): its manifest, its
annotations, its layers' paths and a modelcar's tar members are data.
- Every blob pulled (the config, each layer) is hashed as it arrives and refused unless it
  is exactly its descriptor's size and digest (transport/oci.py blob_pieces).
- A ModelPack layer becomes a file only under its `org.cncf.model.filepath` when that is a
  clean relative name (fs/names.py: no `..`, no absolute start, no `//`), listed once, and
  listed by the version's tpubuild-manifest.json with the layer's size (the manifest and
  the files that describe the version, at most DESCRIPTION_LIMIT); any other layer is a
  line, not a download.
- A modelcar's tar members become files only as `models/<N>/<clean name>`, directories and
  regular files alone (a link, a device or a whiteout is a line), each file no larger than
  the manifest lists; the base image's layers are pulled and checked too, and a member of
  theirs under `models/` (a file beside the model in the image) is a line.
- The manifest's own annotations must name this version: `org.opencontainers.image.version`
  the tag, the recipe, and `org.tpubuild.manifest.digest` the sha256 of the
  tpubuild-manifest.json pulled.
Every file lands inside the temporary directory (created O_EXCL, never through a link).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any, Callable

from tpubuild.errors import UsageError
from tpubuild.fs import clean_relative, inside, version_number
from tpubuild.publish.oci_destination import DOCUMENT_LIMIT, descriptor_problem
from tpubuild.publish.oci_format import (
    FILEPATH,
    LAYER_ROLE,
    MANIFEST_DIGEST,
    MODEL_ARTIFACT,
    MODEL_CONFIG,
    OCI_IMAGE_CONFIG,
    OCI_MANIFEST,
    RECIPE,
    VERSION,
    PiecesReader,
)
from tpubuild.publish.targets import MANIFEST
from tpubuild.publish.verify_remote import VerifyError
from tpubuild.publish.version_check import DESCRIPTION_LIMIT, OWN

GIVE = "give a version: oci://HOST[:PORT]/REPO/<recipe>:<N> or oci://HOST[:PORT]/REPO/<recipe>/<target>:<N>"


def oci_version_components(url: str) -> list[str]:
    """The path components verify checks a version's identity against (`[..., recipe, N]`,
    `[..., recipe, target, N]`): the repository's, then the tag. UsageError when `url` is
    not an oci:// reference to a numbered tag."""
    from tpubuild.config.remote_url import oci_version_reference

    found = oci_version_reference(url)
    if found is None or version_number(found[2]) is None:
        raise UsageError(f"{url}: not a version ({GIVE})")
    _address, repository, tag = found
    return [*repository.split("/"), tag]


def fetch_oci_version(url: str, into: Path, timeouts: Any = None, insecure: bool | None = None
                      ) -> tuple[list[str], set[str]]:
    """The version `url` names, pulled into `into` (a fresh directory of verify's own).
    Returns (problems found before any hashing against the manifest, one line each; names
    the manifest lists that were not pulled). A URL that names no version is a UsageError
    (exit 2); a registry that cannot be read, a VerifyError (exit 1)."""
    from tpubuild.config.remote_url import oci_version_reference
    from tpubuild.transport import Registry

    components = oci_version_components(url)
    found = oci_version_reference(url)
    assert found is not None
    address, repository, tag = found
    registry = Registry(address, timeouts, insecure)
    call = _caller(url)
    got = call("cannot read its manifest", lambda: registry.manifest(repository, tag))
    if got is None:
        raise UsageError(f"{url}: nothing there ({GIVE})")
    try:
        document = json.loads(got.data)
    except ValueError:
        document = None
    if not isinstance(document, dict) or document.get("mediaType", got.media_type) != OCI_MANIFEST:
        raise VerifyError(f"{url}: not an OCI image manifest ({got.media_type or 'no media type'}): not a version "
                          "tpubuild pushed")
    layers: list[Any] = document["layers"] if isinstance(document.get("layers"), list) else []
    config: Any = document.get("config")
    problem = next((p for p in (descriptor_problem(d) for d in [config, *layers]) if p), None)
    if problem or not layers:
        raise VerifyError(f"{url}: its manifest's descriptors are not readable ({problem or 'no layers'})")
    into.mkdir(parents=True, exist_ok=True)
    pull = _Pull(registry, repository, call, os.path.realpath(into), int(components[-1]))
    problems = _annotation_problems(document, components)
    if document.get("artifactType") == MODEL_ARTIFACT and config["mediaType"] == MODEL_CONFIG:
        problems += pull.config(config, "modelfs", "diffIds", [d["digest"] for d in layers])
        problems += pull.modelpack(layers)
    elif config["mediaType"] == OCI_IMAGE_CONFIG:
        ours = [d for d in layers if isinstance(d.get("annotations"), dict) and d["annotations"].get(LAYER_ROLE)]
        problems += pull.config(config, "rootfs", "diff_ids", [d["digest"] for d in ours], tail=True)
        problems += pull.modelcar(layers)
    else:
        raise VerifyError(f"{url}: neither a ModelPack artifact ({MODEL_ARTIFACT}) nor a modelcar image: not a "
                          "version tpubuild pushed")
    notes = document["annotations"] if isinstance(document.get("annotations"), dict) else {}
    digest = notes.get(MANIFEST_DIGEST)
    pulled = Path(pull.root, MANIFEST)
    if pulled.is_file() and not pulled.is_symlink():
        import hashlib

        sha = "sha256:" + hashlib.sha256(pulled.read_bytes()).hexdigest()
        if digest != sha:
            problems.append(f"{MANIFEST}: {sha} is not the digest its OCI manifest's {MANIFEST_DIGEST} names "
                            f"({str(digest)[:80]})")
    return problems, pull.withheld


def _annotation_problems(document: dict[str, Any], components: list[str]) -> list[str]:
    notes: dict[str, Any] = document["annotations"] if isinstance(document.get("annotations"), dict) else {}
    problems = []
    if notes.get(VERSION) != components[-1]:
        problems.append(f"the OCI manifest's {VERSION} says {str(notes.get(VERSION))[:40]!r}, not {components[-1]}")
    if notes.get(RECIPE) not in components[-3:-1]:
        problems.append(f"the OCI manifest's {RECIPE} says {str(notes.get(RECIPE))[:80]!r}, which its repository "
                        "does not name")
    return problems


class _Pull:
    """Blobs of one manifest into `root`, each checked, under clean names only."""

    def __init__(self, registry: Any, repository: str, call: Callable[..., Any], root: str, number: int):
        self.registry, self.repository, self.call, self.root, self.number = registry, repository, call, root, number
        self.withheld: set[str] = set()
        self.listed: dict[str, Any] | None = None  # the pulled manifest's `files`
        self.sizes: dict[str, Any] = {}

    # --- documents ---------------------------------------------------------------------
    def config(self, descriptor: dict[str, Any], section: str, key: str, digests: list[str],
               tail: bool = False) -> list[str]:
        """The config blob, checked, and its list of layer digests against the manifest's
        (`tail`: its last ones, below which a base image's are)."""
        from tpubuild.transport import AnswerTooLarge, BlobMismatch

        what = f"config {descriptor['digest']}"
        if descriptor["size"] > DOCUMENT_LIMIT:
            return [f"{what}: {descriptor['size']} bytes, more than {DOCUMENT_LIMIT}; not pulled"]
        try:
            data = self.call(f"cannot pull its {what}", lambda: b"".join(
                self.registry.blob_pieces(self.repository, descriptor["digest"], descriptor["size"])))
        except (BlobMismatch, AnswerTooLarge) as exc:
            return [f"{what}: {exc}"]
        try:
            listed = json.loads(data)[section][key]
        except (ValueError, KeyError, TypeError):
            return [f"{what}: not a config with {section}.{key}"]
        if not isinstance(listed, list) or (listed[-len(digests):] if tail else listed) != digests:
            return [f"{what}: its {section}.{key} are not the manifest's layers"]
        return []

    def _described(self) -> None:
        """The pulled tpubuild-manifest.json's file list and sizes (none when unreadable)."""
        try:
            manifest = json.loads(Path(self.root, MANIFEST).read_bytes())
        except (OSError, ValueError):
            return
        if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict):
            self.listed = manifest["files"]
            self.sizes = manifest["sizes"] if isinstance(manifest.get("sizes"), dict) else {}

    def limit(self, name: str, size: int | None) -> tuple[int | None, str | None]:
        """(the most bytes `name` may have, None) or (None, why it is not pulled)."""
        if name in OWN:
            return DESCRIPTION_LIMIT, None
        if self.listed is None or name not in self.listed:
            return None, f"{name}: not in the manifest; not pulled"
        expected = self.sizes.get(name)
        if isinstance(expected, int) and not isinstance(expected, bool):
            if size is not None and size != expected:
                self.withheld.add(name)
                more = "more than" if size > expected else "not"
                return None, f"{name}: {size} bytes, {more} the {expected} its manifest lists; not pulled"
            return expected, None
        return size, None  # a manifest without sizes (an older tpubuild's): the layer's own

    def path(self, name: str) -> str | None:
        """Where `name` (clean) goes under the root, its folders made; None when it cannot
        (its folder is a file, it exists already, or it would leave the root)."""
        path = os.path.join(self.root, *name.split("/"))
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError:
            return None
        if os.path.lexists(path) or os.path.commonpath([self.root, os.path.realpath(os.path.dirname(path))]) \
                != self.root:
            return None
        return path

    # --- ModelPack -------------------------------------------------------------------------
    def modelpack(self, layers: list[dict[str, Any]]) -> list[str]:
        from tpubuild.transport import BlobMismatch

        problems: list[str] = []
        named: dict[str, dict[str, Any]] = {}
        for layer in layers:
            notes: dict[str, Any] = layer["annotations"] if isinstance(layer.get("annotations"), dict) else {}
            name = clean_relative(notes.get(FILEPATH))
            if name is None:
                problems.append(f"layer {layer['digest']}: its {FILEPATH} {str(notes.get(FILEPATH))[:100]!r} is not a "
                                "clean relative path; not pulled")
            elif name in named:
                problems.append(f"{name}: two layers say they are it; neither is pulled")
                self.withheld.add(name)
                named[name] = {}
            else:
                named[name] = layer
        if not named.get(MANIFEST):
            return [*problems, f"no layer holds {MANIFEST}: not a version tpubuild pushed"]
        order = [MANIFEST, *sorted(n for n in named if n != MANIFEST)]  # the manifest first: it says the rest
        for name in order:
            layer = named[name]
            if not layer:
                continue
            most, why = self.limit(name, layer["size"])
            if why is None and most is not None and layer["size"] > most:
                why = f"{name}: {layer['size']} bytes, more than the {most} expected; not pulled"
            path = self.path(name) if why is None else None
            if why is None and path is None:
                why = f"{name}: its folder is also a file, or it is listed twice; not pulled"
            if why is not None:
                problems.append(why)
                self.withheld.add(name)
                continue
            assert path is not None
            try:
                self.call(f"cannot pull {name}", lambda p=path, d=layer: self.registry.pull_blob(
                    self.repository, d["digest"], d["size"], p))
            except BlobMismatch as exc:
                problems.append(f"{name}: {exc}")
                self.withheld.add(name)
            if name == MANIFEST:
                self._described()
        return problems

    # --- modelcar ----------------------------------------------------------------------
    def modelcar(self, layers: list[dict[str, Any]]) -> list[str]:
        roles = [d["annotations"].get(LAYER_ROLE) if isinstance(d.get("annotations"), dict) else None for d in layers]
        if roles[-2:] != ["model", "description"] or any(roles[:-2]):
            return ["its layers are not a modelcar tpubuild pushed (its own model and description layers last)"]
        problems = self.tar_layer(layers[-1], "description")
        self._described()
        if self.listed is None:
            return [*problems, f"{MANIFEST}: not in its description layer, or unreadable"]
        problems += self.tar_layer(layers[-2], "model")
        for layer in layers[:-2]:
            problems += self.tar_layer(layer, "base")
        return problems

    def tar_layer(self, layer: dict[str, Any], role: str) -> list[str]:
        """One tar layer, streamed (never whole in memory), hashed as it comes; its members
        under `models/<N>/` written (tpubuild's layers) or refused (a base image's)."""
        import gzip

        from tpubuild.transport import BlobMismatch

        problems: list[str] = []
        what = f"the {role} layer {layer['digest']}"
        media = layer["mediaType"]
        if role != "base" and media != "application/vnd.oci.image.layer.v1.tar":
            return [f"{what}: {media[:80]}, not the uncompressed tar tpubuild pushes"]

        def walk() -> None:
            reader: Any = PiecesReader(self.registry.blob_pieces(self.repository, layer["digest"], layer["size"]))
            if media.endswith(("+gzip", ".tar.gzip")):
                reader = gzip.GzipFile(fileobj=reader, mode="rb")
            elif not media.endswith(".tar"):
                problems.append(f"{what}: {media[:80]} is a layer tpubuild does not read; not checked")
                return
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    line = self.member(tar, member, role)
                    if line:
                        problems.append(f"{what}: {line}")
            while reader.read(1 << 16):  # the rest (a tar's trailing blocks): hashed, so checked
                pass

        try:
            self.call(f"cannot pull {what}", walk)
        except BlobMismatch as exc:
            problems.append(f"{what}: {exc}")
        except (tarfile.TarError, OSError, EOFError) as exc:
            problems.append(f"{what}: not a tar archive ({' '.join(str(exc).split())[:120]})")
        return problems

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, role: str) -> str | None:
        """What is wrong with one member, or None (a regular file written where it goes)."""
        name = member.name
        if role == "base":
            return f"{name[:100]!r}: the base image puts files under models/" \
                if name.lstrip("./").startswith("models") else None
        top = f"models/{self.number}"
        if name in ("models", top) and member.isdir():
            return None
        rel = inside(name, top)
        if rel is None:
            return f"{name[:100]!r} is not a clean name under {top}/; not written"
        if member.isdir():
            return None
        if not member.isreg() or os.path.basename(rel).startswith(".wh."):
            return f"{rel}: not a regular file (a link, a device or a whiteout); not written"
        most, why = self.limit(rel, member.size) if role == "model" else (DESCRIPTION_LIMIT if rel in OWN else
                                                                           member.size, None)
        if role == "description" and self.listed is not None and rel not in self.listed and rel not in OWN:
            return f"{rel}: not in the manifest; not written"
        if why is None and most is not None and member.size > most:
            why = f"{rel}: {member.size} bytes, more than the {most} expected; not written"
        path = self.path(rel) if why is None else None
        if why is None and path is None:
            why = f"{rel}: listed twice, or its folder is a file; not written"
        if why is not None:
            self.withheld.add(rel)
            return why
        assert path is not None
        source = tar.extractfile(member)
        if source is None:
            return f"{rel}: unreadable in the layer"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as out:
            while piece := source.read(1 << 20):
                out.write(piece)
        return None


def _caller(url: str) -> Callable[[str, Callable[[], Any]], Any]:
    """`call(what, fn)`: fn() with the registry's errors said as one line naming the URL
    (a BlobMismatch is an answer, raised as it is: a difference, not a failed read)."""

    def call(what: str, fn: Callable[[], Any]) -> Any:
        from tpubuild.transport import BlobMismatch, RegistryAuthError, RegistryError

        try:
            return fn()
        except BlobMismatch:
            raise
        except (RegistryError, RegistryAuthError) as exc:
            raise VerifyError(f"{url}: {what}: {exc}") from None

    return call
