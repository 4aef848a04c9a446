"""Issue 54 item 2, the source read once: a build hashes the source's large files for its key
by copying them into its session (store/staging.py), and the source step moves those copies
into the store without reading the user's files again. Real files, a real store."""

from __future__ import annotations

import os
import time

import pytest

from tpubuild.digests import StatCache, hash_file
from tpubuild.errors import StageError
from tpubuild.store import Store

SIZE = 5 << 20  # over staging.py's STAGED_MIN_SIZE (4 MiB): a variables data file


def _model(root, data: bytes):
    (root / "variables").mkdir(parents=True)
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(data)
    (root / "saved_model.pb").write_bytes(b"graph")
    # Older than statcache.py's racy window: its stat proves its content.
    past = time.time() - 60
    for path in (root / "variables" / "variables.data-00000-of-00001", root / "saved_model.pb"):
        os.utime(path, (past, past))
    return root / "variables" / "variables.data-00000-of-00001"


def test_the_stored_source_is_the_copy_made_as_it_was_hashed(tmp_path):
    """After the key was taken, the user's file is replaced by other bytes of its size: the
    store still gets the hashed bytes, from the staged copy, and the step never reads the
    user's file again (it would find other bytes and refuse)."""
    data = os.urandom(SIZE)
    variables = _model(tmp_path / "model", data)
    store = Store(tmp_path / "cache")
    stat = StatCache(None)
    tree, files = stat.tree(tmp_path / "model", store.staging.hash)
    digest = {f.path: f.hash for f in files}["variables/variables.data-00000-of-00001"]
    assert digest == hash_file(variables)
    replacement = variables.with_name("new")
    replacement.write_bytes(os.urandom(SIZE))
    os.replace(replacement, variables)
    entry = store.put_files("k" * 64, "source", files, tmp_path / "model", {}, stat)
    assert store.object_path(digest).read_bytes() == data
    assert oct(os.stat(store.object_path(digest)).st_mode & 0o777) == "0o444"
    assert entry.tree == tree
    # Nothing is left in the session: the copy became the object.
    assert [p.name for p in store.session_dir().rglob("*.staged")] == []


def test_a_copy_the_store_already_has_is_dropped(tmp_path):
    """The same bytes under a new stat (a touch): staged again, and dropped at the step,
    which finds the object in the store."""
    data = os.urandom(SIZE)
    variables = _model(tmp_path / "model", data)
    store = Store(tmp_path / "cache")
    _, files = StatCache(None).tree(tmp_path / "model", store.staging.hash)
    store.put_files("k" * 64, "source", files, tmp_path / "model", {}, StatCache(None))
    os.utime(variables, (time.time() - 30, time.time() - 30))
    stat = StatCache(None)
    _, again = stat.tree(tmp_path / "model", store.staging.hash)
    assert again == files
    assert len(list(store.session_dir().rglob("*.staged"))) == 1
    store.put_files("j" * 64, "source", again, tmp_path / "model", {}, stat)
    assert list(store.session_dir().rglob("*.staged")) == []


def test_a_file_changed_since_it_was_found_is_refused(tmp_path):
    """The stat the walk found, compared with the file's when it is opened and after it was
    read: a write in between (ctime moves) is one line, and no copy is left."""
    variables = _model(tmp_path / "model", os.urandom(SIZE))
    store = Store(tmp_path / "cache")
    found = os.stat(variables)
    with open(variables, "r+b") as f:
        f.write(b"x")
    with pytest.raises(StageError, match=r"variables.data-00000-of-00001 changed while it was being read \(build again\)"):
        store.staging.hash(str(variables), found)
    assert list(store.session_dir().rglob("*.staged")) == []


def test_a_fresh_file_is_hashed_again_from_its_descriptor(tmp_path):
    """A file written just now (inside the racy window) cannot prove by its stat that it
    held the bytes read: it is read a second time, and agrees."""
    data = os.urandom(SIZE)
    (tmp_path / "fresh").write_bytes(data)
    store = Store(tmp_path / "cache")
    path = str(tmp_path / "fresh")
    assert store.staging.hash(path, os.stat(path)) == hash_file(path)


def test_small_files_are_hashed_not_staged(tmp_path):
    (tmp_path / "small").write_bytes(b"a" * 1000)
    store = Store(tmp_path / "cache")
    path = str(tmp_path / "small")
    assert store.staging.hash(path, os.stat(path)) == hash_file(path)
    assert not store.session_dir().exists() or list(store.session_dir().rglob("*.staged")) == []


FULL = r"""
import os, resource, signal, sys
from tpubuild.store import Store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
store = Store(sys.argv[2])
try:
    store.staging.hash(sys.argv[1], os.stat(sys.argv[1]))
except OSError as exc:
    print(exc.errno, exc.filename)
    print(sorted(p.name for p in store.session_dir().rglob("*.staged")))
"""


def test_a_copy_the_disk_refuses_names_its_file_and_leaves_none(tmp_path):
    """The file system refuses the copy's bytes (a file size limit here: the kernel's EFBIG,
    as a full disk's ENOSPC): the error names the copy, the build's one line says where
    (errors.py), and no partial copy is left in the session."""
    import errno
    import subprocess
    import sys

    from tests.cli import REPO

    (tmp_path / "big").write_bytes(os.urandom(SIZE))
    done = subprocess.run([sys.executable, "-c", FULL, str(tmp_path / "big"), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    code, filename = done.stdout.splitlines()[0].split(" ", 1)
    assert int(code) == errno.EFBIG and filename.startswith(str(tmp_path / "cache")) and filename.endswith(".staged")
    assert done.stdout.splitlines()[1] == "[]"
