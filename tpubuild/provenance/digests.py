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
import threading
from pathlib import Path
from typing import Any, Callable

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
                       object_path: Callable[[str], Path], known: Known | None = None) -> dict[str, dict[str, str]]:
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
                    found[name] = {"dirHash": dir_hash([(f.path, _checked(object_path(f.hash), f.hash, known))
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
# What a caller computes itself now (publish does not wait for the thread ahead, which runs
# at the lowest priority: engine/loop.py): a pass ahead over one of them stops at its next
# chunk; and every pass stops when the build ends (stop_ahead).
_WANTED: set[str] = set()
_STOPPED = threading.Event()

# Known(st): the BLAKE3 of the file whose fstat is `st` when this process hashed that
# inode itself and it is unchanged since (store/objects.py known_object), else None.
Known = Callable[[os.stat_result], str | None]


class _Abandoned(Exception):
    """A pass ahead gave way: its object is wanted now by a caller that reads it itself."""


def _read_into(fd: int, hashers: list[Any], digest: str, ahead: bool) -> None:
    while chunk := os.read(fd, CHUNK):
        if ahead and (digest in _WANTED or _STOPPED.is_set()):
            raise _Abandoned(digest)
        for hasher in hashers:
            hasher.update(chunk)


def _checked(path: Path, digest: str, known: Known | None = None, ahead: bool = False) -> str:
    """SHA-256 of an object whose BLAKE3 must be `digest`. An object this process hashed
    itself (`known`) is read for its SHA-256 alone: its BLAKE3 was taken from these bytes
    (issue 54: an 8 GiB source's two hashes in one pass took ~13 s of a core beside the
    stages; SHA-256 alone ~5 s)."""
    found = _SHA256.get(digest)
    if found is not None:
        return found
    if not ahead:
        _WANTED.add(digest)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        sha = hashlib.sha256()
        b3 = None if known is not None and known(os.fstat(fd)) == digest else blake3.blake3()
        _read_into(fd, [sha] if b3 is None else [sha, b3], digest, ahead)
        if b3 is not None and b3.hexdigest() != digest:
            raise _Changed(path)
    finally:
        os.close(fd)
    found = _SHA256[digest] = sha.hexdigest()
    return found


def published_sha256(path: Path, digest: str | None, known: Known | None) -> str:
    """SHA-256 of a file of a version being published (its in-toto subject digest),
    `digest` its BLAKE3 by the manifest: taken from what this process computed for that
    object (compute_ahead) when the file is a hard link of an inode this process hashed
    and holds unchanged (`known`), else read from the file. The subject names what the
    file holds either way."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if digest is None or known is None or known(os.fstat(fd)) != digest:
            return _sha256_fd(fd)
        found = _SHA256.get(digest)
        if found is None:
            _WANTED.add(digest)  # a pass ahead over it gives way
            found = _SHA256[digest] = _sha256_fd(fd)
        return found
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    sha = hashlib.sha256()
    _read_into(fd, [sha], "", False)
    return sha.hexdigest()


def compute_ahead(files: list[FileEntry], object_path: Callable[[str], Path], known: Known | None = None) -> None:
    """The SHA-256 of a tree's objects, for the dependency_digests and the subjects of a
    version published later in this process: a build computes the source model's, and
    those of each new object a stage writes (the artifact's variables), while the stages
    after run in workers (engine/loop.py), not at publish (BERT-base: 0.4 s of reading
    420 MiB; an 8 GiB model's 4 GiB bfloat16 artifact: ~2.7 s). An object that is gone,
    changed, or wanted now by publish itself (which never waits for this) gets nothing
    here; publish reads what it lacks."""
    from tpubuild.trace_events import span

    with span("the standard digests of stored objects (ahead)", cat="cache", files=len(files)):
        for f in files:
            if _STOPPED.is_set():
                return
            try:
                _checked(object_path(f.hash), f.hash, known, ahead=True)
            except (OSError, _Changed, _Abandoned):
                continue


def start_ahead() -> None:
    """A build's passes ahead may run (stop_ahead of an earlier build in this process undone)."""
    _STOPPED.clear()


def stop_ahead() -> None:
    """Every pass ahead stops at its next chunk: the build ended, what it did not compute
    is no longer wanted."""
    _STOPPED.set()
