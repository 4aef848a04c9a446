"""What a version is in an OCI registry, byte for byte (publish/oci_publish.py pushes it,
publish/oci_fetch.py reads it back): a CNCF ModelPack artifact or a KServe modelcar image,
and the claim of a number. Pure: no registry, no network; the same version gives the same
bytes, so the same manifest digest (JSON with sorted keys and no spaces; no time but the
version's own, or SOURCE_DATE_EPOCH).

ModelPack (modelpack/model-spec v1: docs/spec.md, docs/config.md, docs/annotations.md,
specs-go/v1): an image manifest with `artifactType` MODEL_ARTIFACT, its config a
MODEL_CONFIG document of exactly `descriptor`, `config` and `modelfs` (schema/config-schema.json
allows no other key), `modelfs.diffIds` the layers' digests in order; one `.raw` layer per
file of the version in path order (a raw layer's digest is the file's sha256), its kind
(`weight`, `weight.config`, `doc`, `code`) as modctl classifies a file name
(modelpack/modctl pkg/modelfile/constants.go InferFileType), each annotated with its path
(`org.cncf.model.filepath`, and `org.opencontainers.image.title`, which oras pulls a layer
to) and `org.cncf.model.file.metadata+json` (modctl's FileMetadata: name, mode 0644, uid and
gid 0, size, mtime, typeflag 0).

Modelcar (KServe's modelcar convention: the model under `/models` of an image;
kserve pkg/utils/storage.go mounts the image's `models` at /mnt/models, and its TF Serving
runtime reads `--model_base_path=/mnt/models`, config/runtimes/kserve-tensorflow-serving.yaml):
an OCI image whose layers are uncompressed tars (so a layer's digest is its diff_id)
holding `models/<N>/...`: one of the model's files, one of the files that describe it
(the manifest, provenance, signature and report, which a re-measured build changes while
the model's bytes stay), entries sorted, directories 0755 and files 0644, owner 0:0, one
fixed mtime. With a base image, its layers come first and its config is kept, the model's
diff_ids and history appended.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import re
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tpubuild.digests import CHUNK

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LAYERS = {"application/vnd.docker.image.rootfs.diff.tar": OCI_LAYER_TAR,
                 "application/vnd.docker.image.rootfs.diff.tar.gzip": OCI_LAYER_GZIP}
# The empty descriptor (opencontainers/image-spec manifest.md "Guidance for an Empty Descriptor").
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
CLAIM_ARTIFACT = "application/vnd.tpubuild.claim.v1"
FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
TITLE = "org.opencontainers.image.title"
VERSION = "org.opencontainers.image.version"
CREATED = "org.opencontainers.image.created"
# tpubuild's own annotations of a version's manifest: the recipe, and the digest of the
# version's tpubuild-manifest.json (its layer in a ModelPack artifact; a file of the
# description layer in a modelcar).
RECIPE = "org.tpubuild.recipe"
MANIFEST_DIGEST = "org.tpubuild.manifest.digest"
LAYER_ROLE = "org.tpubuild.layer"  # a modelcar's "model" and "description" layers
CLAIM_NUMBER = "org.tpubuild.claim.number"
CLAIM_JOB = "org.tpubuild.claim.job"
FORMATS = ("modelpack", "modelcar")

# modctl's classification of a file name (pkg/modelfile/constants.go), the patterns a
# version of tpubuild can hold: weights; the weights' configuration; documentation;
# anything else small is code, large (over WeightFileSizeThreshold, 128 MB) weights.
_WEIGHT = re.compile(r".*\.(pb|tflite|h5|hdf5?|index|meta|safetensors|bin|pt|pth|gguf)$|.*\.data-.*")
_WEIGHT_CONFIG = re.compile(r".*\.(json|jsonl|yaml|yml|toml|ini|cfg|conf|config|xml|params|hparams)$"
                            r"|vocab\.txt|merges\.txt|added_tokens\.txt|.*tokenizer\.model.*|spiece\.model")
_DOC = re.compile(r".*\.(md|markdown|rst|txt|pdf|html?)$|readme.*|license.*|notice.*|model\.sig")
WEIGHT_SIZE = 128 * 1000 * 1000


def layer_media_type(path: str, size: int) -> str:
    """The ModelPack `.raw` media type of a version's file."""
    name = path.rsplit("/", 1)[-1].lower()
    if _WEIGHT_CONFIG.fullmatch(name):
        kind = "weight.config"
    elif _WEIGHT.fullmatch(name):
        kind = "weight"
    elif _DOC.fullmatch(name):
        kind = "doc"
    else:
        kind = "weight" if size > WEIGHT_SIZE else "code"
    return f"application/vnd.cncf.model.{kind}.v1.raw"


def packed(document: Any) -> bytes:
    """The one serialization of every JSON document pushed: sorted keys, no spaces."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def version_time(manifest: dict[str, Any]) -> int:
    """The one time a version's pushed documents and tar entries carry (seconds since the
    epoch): SOURCE_DATE_EPOCH when set (reproducible-builds.org), else the version's own
    `created` (fixed once the version is published), else 0."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    if epoch.isdigit():
        return int(epoch)
    created = manifest.get("created")
    if isinstance(created, str):
        try:
            return calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))
        except ValueError:
            pass
    return 0


def rfc3339(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass(frozen=True)
class LocalFile:
    """A file of a version: its path in the version, where it is, its size and sha256 (hex)."""

    rel: str
    path: Path
    size: int
    sha256: str


@dataclass
class Blob:
    """A blob to push: its descriptor, and where its bytes come from: `data`, a file
    (`path`), or a deterministic tar (`tar`)."""

    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    data: bytes | None = None
    path: Path | None = None
    tar: TarLayer | None = None

    def descriptor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    def open(self, offset: int) -> BinaryIO:
        """The blob's bytes from `offset` (transport/oci.py Registry.push_blob's source)."""
        if self.path is not None:
            handle = open(self.path, "rb")  # noqa: SIM115 - the caller closes it
            handle.seek(offset)
            return handle
        if self.tar is not None:
            return self.tar.open(offset)
        raise ValueError("a blob of bytes is sent as bytes")


def blob_of(data: bytes, media_type: str) -> Blob:
    return Blob(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data)


# --- ModelPack --------------------------------------------------------------------------
def modelpack(recipe: str, number: int, files: list[LocalFile], seconds: int, manifest_digest: str,
              revision: str | None = None) -> tuple[Blob, list[Blob], bytes]:
    """(config, layers, manifest bytes) of version `number` of `recipe` as a ModelPack artifact."""
    stamp = rfc3339(seconds)
    layers = []
    for entry in sorted(files, key=lambda f: f.rel):
        metadata = {"name": entry.rel.rsplit("/", 1)[-1], "mode": 0o644, "uid": 0, "gid": 0, "size": entry.size,
                    "mtime": stamp, "typeflag": 0}
        layers.append(Blob(layer_media_type(entry.rel, entry.size), f"sha256:{entry.sha256}", entry.size,
                           {FILEPATH: entry.rel, FILE_METADATA: packed(metadata).decode(), TITLE: entry.rel},
                           path=entry.path))
    descriptor: dict[str, Any] = {"name": recipe, "version": str(number), "createdAt": stamp}
    if revision:
        descriptor["revision"] = revision
    config = blob_of(packed({"descriptor": descriptor, "config": {"format": "saved_model"},
                             "modelfs": {"type": "layers", "diffIds": [b.digest for b in layers]}}), MODEL_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": MODEL_ARTIFACT,
                "config": config.descriptor(), "layers": [b.descriptor() for b in layers],
                "annotations": _annotations(recipe, number, stamp, manifest_digest)}
    return config, layers, packed(manifest)


def _annotations(recipe: str, number: int, stamp: str, manifest_digest: str) -> dict[str, str]:
    return {VERSION: str(number), CREATED: stamp, RECIPE: recipe, MANIFEST_DIGEST: manifest_digest}


# --- modelcar ---------------------------------------------------------------------------
class TarLayer:
    """A deterministic uncompressed tar of `models/<N>/<file>` entries, made as it is read
    (never whole in memory, never written to disk): its size is known from the entries, its
    digest from one reading (`digest`), and `open(offset)` makes it again from any offset."""

    def __init__(self, number: int, files: list[LocalFile], seconds: int, blake3: dict[str, str] | None = None):
        self.number, self.seconds = number, seconds
        self.files = sorted(files, key=lambda f: f.rel)
        # What each file's BLAKE3 must be (its manifest's): checked as the digest is taken, so
        # the bytes the registry then checks against that digest are the bytes the manifest lists.
        self.blake3 = blake3
        self._digest: str | None = None

    def _directories(self) -> list[str]:
        found = {"models", f"models/{self.number}"}
        for entry in self.files:
            parts = entry.rel.split("/")[:-1]
            found.update(f"models/{self.number}/" + "/".join(parts[:i + 1]) for i in range(len(parts)))
        return sorted(found)

    def _header(self, name: str, size: int, directory: bool) -> bytes:
        info = tarfile.TarInfo(name + ("/" if directory else ""))
        info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
        info.mode = 0o755 if directory else 0o644
        info.size = 0 if directory else size
        info.mtime = self.seconds
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")

    def _plan(self) -> list[tuple[bytes, LocalFile | None]]:
        entries: list[tuple[str, LocalFile | None]] = [(d, None) for d in self._directories()]
        entries += [(f"models/{self.number}/{f.rel}", f) for f in self.files]
        entries.sort(key=lambda e: e[0])
        return [(self._header(name, f.size if f else 0, f is None), f) for name, f in entries]

    @property
    def size(self) -> int:
        total = 1024  # two zero blocks end the archive
        for header, entry in self._plan():
            total += len(header) + (_padded(entry.size) if entry else 0)
        return total

    def pieces(self, check: bool = False) -> Iterator[bytes]:
        """The archive's bytes; with `check`, each file's BLAKE3 compared with `blake3`'s."""
        import blake3

        for header, entry in self._plan():
            yield header
            if entry is None:
                continue
            done = 0
            hasher = blake3.blake3() if check and self.blake3 is not None else None
            with open(entry.path, "rb") as handle:
                while done < entry.size and (piece := handle.read(min(CHUNK, entry.size - done))):
                    done += len(piece)
                    if hasher is not None:
                        hasher.update(piece)
                    yield piece
                grown = bool(handle.read(1))
            if done != entry.size or grown:
                raise OSError(f"{entry.path}: not {entry.size} bytes (changed while it was read?)")
            if hasher is not None and self.blake3 is not None and hasher.hexdigest() != self.blake3.get(entry.rel):
                raise OSError(f"{entry.path}: differs from its manifest")
            yield b"\0" * (_padded(entry.size) - entry.size)
        yield b"\0" * 1024

    @property
    def digest(self) -> str:
        if self._digest is None:
            hasher = hashlib.sha256()
            for piece in self.pieces(check=True):
                hasher.update(piece)
            self._digest = "sha256:" + hasher.hexdigest()
        return self._digest

    def open(self, offset: int) -> BinaryIO:
        return PiecesReader(self.pieces(), offset)  # type: ignore[return-value]


def _padded(size: int) -> int:
    return (size + 511) // 512 * 512


class PiecesReader:
    """A read-only file object over an iterator of pieces (a tar made as it is read, a blob
    as it arrives), from `skip` bytes in."""

    def __init__(self, pieces: Iterator[bytes], skip: int = 0):
        self._pieces, self._held = pieces, b""
        while skip > 0:
            piece = next(self._pieces, b"")
            if not piece:
                break
            if len(piece) > skip:
                self._held = piece[skip:]
                break
            skip -= len(piece)

    def read(self, size: int = -1) -> bytes:
        while not self._held:
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            self._held = piece
        size = len(self._held) if size is None or size < 0 else size
        out, self._held = self._held[:size], self._held[size:]
        return out

    def close(self) -> None:
        self._pieces = iter(())


@dataclass(frozen=True)
class BaseImage:
    """The base of a modelcar: its repository in the destination's registry, its layers'
    descriptors, and its config (parsed)."""

    repository: str
    layers: list[dict[str, Any]]
    config: dict[str, Any]


def modelcar(recipe: str, number: int, model_files: list[LocalFile], description_files: list[LocalFile],
             seconds: int, manifest_digest: str, base: BaseImage | None = None,
             blake3: dict[str, str] | None = None) -> tuple[Blob, list[Blob], bytes]:
    """(config, tpubuild's layers, manifest bytes) of version `number` as a modelcar image
    (the base's layers, listed in the manifest first, are the base's blobs). `blake3`: what
    each file must hash to (TarLayer)."""
    stamp = rfc3339(seconds)
    layers = []
    for role, files in (("model", model_files), ("description", description_files)):
        tar = TarLayer(number, files, seconds, blake3)
        layers.append(Blob(OCI_LAYER_TAR, tar.digest, tar.size, {LAYER_ROLE: role}, tar=tar))
    config: dict[str, Any] = dict(base.config) if base else {"architecture": "amd64", "os": "linux", "config": {}}
    rootfs = dict(config.get("rootfs") or {})
    diff_ids = [d for d in rootfs.get("diff_ids", []) if isinstance(d, str)] if base else []
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids + [b.digest for b in layers]}
    history = list(config.get("history") or []) if base else []
    history += [{"created": stamp, "created_by": f"tpubuild: {recipe} version {number} ({role})"}
                for role in ("model", "description")]
    config["history"] = history
    config["created"] = stamp
    config_blob = blob_of(packed(config), OCI_IMAGE_CONFIG)
    base_layers = [dict(layer, mediaType=DOCKER_LAYERS.get(layer["mediaType"], layer["mediaType"]))
                   for layer in (base.layers if base else [])]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_blob.descriptor(),
                "layers": base_layers + [b.descriptor() for b in layers],
                "annotations": _annotations(recipe, number, stamp, manifest_digest)}
    return config_blob, layers, packed(manifest)


# --- claims -------------------------------------------------------------------------------
CLAIM_TAG = re.compile(r"tpubuild-claim-(0|[1-9][0-9]{0,18})-([0-9a-f]{24})")


def claim_tag(number: int, token: str) -> str:
    return f"tpubuild-claim-{number}-{token}"


def claim_manifest(number: int, token: str, job: dict[str, Any]) -> bytes:
    """The manifest a claim tag names: an artifact with no content (the empty descriptor as
    config and layer) whose annotations say which number and whose job."""
    empty = {"mediaType": EMPTY_TYPE, "digest": EMPTY_DIGEST, "size": len(EMPTY)}
    return packed({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": CLAIM_ARTIFACT,
                   "config": empty, "layers": [empty],
                   "annotations": {CLAIM_NUMBER: str(number), CLAIM_JOB: packed({**job, "token": token}).decode(),
                                   CREATED: rfc3339(int(time.time()))}})
