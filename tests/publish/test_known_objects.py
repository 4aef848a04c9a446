"""Publishing the objects this process hashed itself (issue 54): a hard link of one is not
read again (fs/place.py place_file's `known`), its in-toto subject digest is the one
computed ahead (provenance/digests.py), and an object changed since its hash is read and
refused as before. Real store, real files, the process's own I/O counters."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tpubuild import io_counters
from tpubuild.digests import StatCache
from tpubuild.errors import StageError
from tpubuild.provenance import digests, statement
from tpubuild.publish import versions
from tpubuild.store import Store

SIZE = 1 << 20  # read by pread below THREADED_MIN_SIZE: counted in rchar (a mapping would not be)


def _stored(tmp_path: Path) -> tuple[Store, list]:
    store = Store(tmp_path / "cache")
    work = store.new_workdir("bfloat16")
    (Path(work) / "variables").mkdir()
    (Path(work) / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(SIZE))
    (Path(work) / "saved_model.pb").write_bytes(b"graph")
    entry = store.put("a" * 64, "bfloat16", Path(work), {}, [], {"stage": "bfloat16"}, StatCache(None))
    return store, [(f, store.object_path(f.hash)) for f in entry.files]


def _manifest(pairs: list) -> dict:
    return {"recipe": "r", "recipe_file": "recipes/r.yaml", "recipe_digest": "d", "content": "c",
            "files": {f.path: f.hash for f, _ in pairs}}


def _read_while(call) -> int:  # type: ignore[no-untyped-def]
    before = io_counters.read(io_counters.THREAD)
    call()
    return io_counters.since(before, io_counters.THREAD)["rchar"]


def test_a_hard_link_of_an_object_this_process_hashed_is_published_without_reading_it(tmp_path: Path) -> None:
    store, pairs = _stored(tmp_path)
    out = tmp_path / "out" / "r"
    unread = _read_while(lambda: versions.publish(out, pairs, _manifest(pairs), None, link_type="hardlink",
                                                  known=store.known_object))
    read = _read_while(lambda: versions.publish(out, pairs, _manifest(pairs), None, link_type="hardlink"))
    assert unread < SIZE <= read, (unread, read)  # the check read the variables once, only without `known`
    for number in ("1", "2"):
        for entry, obj in pairs:
            published = out / number / entry.path
            assert os.stat(published).st_ino == os.stat(obj).st_ino  # a link of the object
            assert published.read_bytes() == obj.read_bytes()


def test_an_object_written_after_this_process_hashed_it_is_read_and_refused(tmp_path: Path) -> None:
    store, pairs = _stored(tmp_path)
    variables = next(obj for entry, obj in pairs if entry.path.startswith("variables/"))
    os.chmod(variables, 0o644)
    with open(variables, "r+b") as f:  # the same size, the same inode, other bytes: its mtime moves
        f.write(b"EVIL")
    os.chmod(variables, 0o444)
    with pytest.raises(StageError, match=f"cache object {variables} changed after it was checked"):
        versions.publish(tmp_path / "out" / "r", pairs, _manifest(pairs), None, link_type="hardlink",
                         known=store.known_object)


@pytest.mark.parametrize("link_type", ["hardlink", "copy"])
def test_the_subjects_name_the_published_bytes_whether_computed_ahead_or_read(tmp_path: Path, link_type: str) -> None:
    store, pairs = _stored(tmp_path)
    digests.compute_ahead([entry for entry, _ in pairs], store.object_path, store.known_object)
    manifest = _manifest(pairs)
    number = versions.publish(tmp_path / "out" / "r", pairs, manifest, None, link_type=link_type,
                              known=store.known_object,
                              finish=lambda d, m, t: statement.write(d, m, None, t, known=store.known_object))
    version = tmp_path / "out" / "r" / str(number)
    stated = json.loads((version / statement.PROVENANCE).read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in stated["subject"]}
    on_disk = {p.relative_to(version).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in version.rglob("*") if p.is_file() and p.name != statement.PROVENANCE}
    assert subjects == on_disk and len(on_disk) == 3


def test_a_subject_is_read_from_the_file_when_its_inode_is_not_the_object_hashed(tmp_path: Path) -> None:
    store, pairs = _stored(tmp_path)
    digests.compute_ahead([entry for entry, _ in pairs], store.object_path, store.known_object)
    entry, obj = pairs[0]
    other = tmp_path / "other"
    other.write_bytes(b"not the object")  # claimed by the manifest to be the object: its own bytes are stated
    stated = digests.published_sha256(other, entry.hash, store.known_object)
    assert stated == hashlib.sha256(b"not the object").hexdigest()
    assert digests.published_sha256(obj, entry.hash, store.known_object) == hashlib.sha256(obj.read_bytes()).hexdigest()
