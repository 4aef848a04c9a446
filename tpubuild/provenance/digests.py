"""The standard digests of a version's resolved dependencies, for in-toto consumers.

tpubuild identifies its inputs by BLAKE3 (digests/hashing.py). in-toto's DigestSet
(https://github.com/in-toto/attestation/blob/main/spec/v1/digest_set.md) names BLAKE3 by
no standard key, and a consumer "MUST ignore unrecognized" algorithms: a statement that
names the source model and the export script only by BLAKE3 identifies them to nobody.
So each dependency also gets:
- a file (`file:`, `import:`): `sha256` of its bytes;
- a directory (`dir:`, the source SavedModel): `dirHash`, the spec's directory digest
  (Go's dirhash Hash1 in hex: SHA-256 over the lines `<sha256 hex>  <path>\\n` of its
  files sorted by path, i.e. `find . -type f | cut -c3- | LC_ALL=C sort | xargs -r
  sha256sum | sha256sum`).
Each is computed from bytes whose BLAKE3 is the recorded one (a workspace file read again
in one pass with both hashes, the source model from its verified cache objects); a file
changed since the build hashed it gets no standard digest rather than a wrong one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import blake3

from tpubuild.digests import CHUNK, FileEntry, tree_digest


def blake3_and_sha256(path: Path | str) -> tuple[str, str]:
    """(BLAKE3, SHA-256) of a file's bytes, read once (also what an OCI push checks a file
    against its manifest with and names its blob by: publish/oci_publish.py)."""
    b3, sha = blake3.blake3(), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            b3.update(chunk)
            sha.update(chunk)
    return b3.hexdigest(), sha.hexdigest()


def dir_hash(files: list[tuple[str, str]]) -> str:
    """in-toto `dirHash` of (relative POSIX path, SHA-256 hex) pairs."""
    lines = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(files, key=lambda f: f[0].encode()))
    return hashlib.sha256(lines.encode()).hexdigest()


def dependency_digests(root: Path, inputs: dict[str, str], trees: dict[str, list[FileEntry]],
                       object_path: Callable[[str], Path]) -> dict[str, dict[str, str]]:
    """{input name: {"sha256" | "dirHash": hex}} for the inputs (`run_inputs`: name ->
    BLAKE3 digest) whose bytes still are the ones hashed; `trees` maps a tree digest to its
    files, whose objects `object_path` names (verified by the build)."""
    found: dict[str, dict[str, str]] = {}
    for name, digest in inputs.items():
        kind, _, rel = name.partition(":")
        try:
            if kind == "dir":
                files = trees.get(digest)
                if files is not None and tree_digest(files) == digest:
                    found[name] = {"dirHash": dir_hash([(f.path, _checked(object_path(f.hash), f.hash))
                                                        for f in files])}
            elif kind in ("file", "import"):
                b3, sha = blake3_and_sha256(os.path.join(root, rel))
                if b3 == digest:
                    found[name] = {"sha256": sha}
        except (OSError, _Changed):
            continue  # gone or changed since the build hashed it: no standard digest, not a wrong one
    return found


class _Changed(Exception):
    pass


# BLAKE3 hex -> SHA-256 hex of the same bytes, as _checked read them: an object's BLAKE3
# names its bytes, so its SHA-256 is known once it was computed (by compute_ahead or an
# earlier version published in this process).
_SHA256: dict[str, str] = {}


def _checked(path: Path, digest: str) -> str:
    """SHA-256 of an object whose BLAKE3 must be `digest`."""
    known = _SHA256.get(digest)
    if known is not None:
        return known
    b3, sha = blake3_and_sha256(path)
    if b3 != digest:
        raise _Changed(path)
    _SHA256[digest] = sha
    return sha


def compute_ahead(files: list[FileEntry], object_path: Callable[[str], Path]) -> None:
    """The SHA-256 of a tree's objects, for the dependency_digests of a version published
    later in this process: a build computes the source model's while its stages run in
    workers (engine/loop.py), not after them (BERT-base: 0.4 s of reading 420 MiB at
    publish). An object that is gone or changed gets nothing here; publish tries again."""
    for f in files:
        try:
            _checked(object_path(f.hash), f.hash)
        except (OSError, _Changed):
            continue
