"""The source's in-toto digests computed ahead, while the stages run (provenance/digests.py
compute_ahead): publish states the digests of the bytes it names, as when it reads them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3

from tpubuild.digests import FileEntry, tree_digest
from tpubuild.provenance import digests


def _objects(root: Path, files: dict[str, bytes]) -> list[FileEntry]:
    entries = []
    for rel, data in files.items():
        digest = blake3.blake3(data).hexdigest()
        (root / digest).write_bytes(data)
        entries.append(FileEntry(rel, digest, len(data)))
    return entries


def test_digests_computed_ahead_are_the_ones_publish_reads_and_a_changed_object_gets_none(tmp_path):
    files = {"saved_model.pb": b"graph " * 1000, "variables/variables.index": b"index of " + bytes(range(256))}
    entries = _objects(tmp_path, files)
    tree = tree_digest(entries)
    expected = digests.dir_hash([(rel, hashlib.sha256(data).hexdigest()) for rel, data in files.items()])

    digests.compute_ahead(entries, lambda digest: tmp_path / digest)
    # Read again from files now gone: the digests computed ahead are the ones stated.
    for entry in entries:
        (tmp_path / entry.hash).unlink()
    stated = digests.dependency_digests(tmp_path, {"dir:model": tree}, {tree: entries}, lambda d: tmp_path / d)
    assert stated == {"dir:model": {"dirHash": expected}}

    # An object whose bytes are not its name's: neither computed ahead nor stated.
    other = {"saved_model.pb": b"another graph"}
    [entry] = _objects(tmp_path, other)
    (tmp_path / entry.hash).write_bytes(b"changed on disk")
    digests.compute_ahead([entry], lambda digest: tmp_path / digest)
    tree = tree_digest([entry])
    assert digests.dependency_digests(tmp_path, {"dir:m": tree}, {tree: [entry]}, lambda d: tmp_path / d) == {}


def test_digests_ahead_stop_when_the_build_ends_and_publish_reads_what_they_lack(tmp_path):
    files = {"saved_model.pb": os.urandom(1000)}  # bytes no other test's digests computed (they are kept)
    entries = _objects(tmp_path, files)
    tree = tree_digest(entries)
    expected = {"dir:model": {"dirHash": digests.dir_hash([("saved_model.pb", hashlib.sha256(files["saved_model.pb"])
                                                                                  .hexdigest())])}}
    digests.stop_ahead()  # the build ended: a pass ahead computes nothing
    try:
        digests.compute_ahead(entries, lambda digest: tmp_path / digest)
    finally:
        digests.start_ahead()
    (tmp_path / "moved").mkdir()
    for entry in entries:
        (tmp_path / entry.hash).rename(tmp_path / "moved" / entry.hash)
    assert digests.dependency_digests(tmp_path, {"dir:model": tree}, {tree: entries}, lambda d: tmp_path / d) == {}
    # Publish reads what the passes ahead did not compute.
    assert digests.dependency_digests(tmp_path, {"dir:model": tree}, {tree: entries},
                                      lambda d: tmp_path / "moved" / d) == expected
