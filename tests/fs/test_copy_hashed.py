"""fs/place.py copy_hashed: the source's copy into the cache, hashed behind the kernel's copy
of it, then fsynced: the same bytes and the same digest as a copy then a hash, whatever the
pieces, and a refused write raised where it happens."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tpubuild.digests import hash_file
from tpubuild.fs import copy_hashed, place


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 5 << 20, (7 << 20) + 12345], ids=str)
def test_the_copy_and_its_digest_are_a_copy_and_a_hash(tmp_path: Path, size: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps of 1 MiB: a few MiB cross many of them, short last piece included (the pieces
    # of 4 MiB or more are memory-mapped, smaller ones read: hashing.THREADED_MIN_SIZE).
    monkeypatch.setattr(place, "COPY_STEP", 1 << 20)
    src = tmp_path / "src"
    src.write_bytes(os.urandom(size))
    dst_dir = tmp_path / "out"
    dst_dir.mkdir()
    fd = os.open(dst_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        digest = copy_hashed(src, "copy", dst_dir_fd=fd)
    finally:
        os.close(fd)
    copy = dst_dir / "copy"
    assert digest == hash_file(src)
    assert copy.read_bytes() == src.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o444
    assert os.stat(copy).st_ino != os.stat(src).st_ino


def test_pieces_of_several_mib_are_hashed_mapped_at_any_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps of 5 MiB and 4,103 bytes: each piece is mapped (4 MiB or more) and begins at an
    # offset that is no multiple of a page; its mapping starts at the page below.
    monkeypatch.setattr(place, "COPY_STEP", (5 << 20) + 4096 + 7)
    src = tmp_path / "src"
    src.write_bytes(os.urandom(23 << 20))
    digest = copy_hashed(src, str(tmp_path / "copy"))
    assert digest == hash_file(src) == hash_file(tmp_path / "copy")


def test_a_name_that_exists_is_never_written_through(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"new")
    (tmp_path / "taken").write_bytes(b"someone's")
    with pytest.raises(FileExistsError):
        copy_hashed(tmp_path / "src", str(tmp_path / "taken"))
    assert (tmp_path / "taken").read_bytes() == b"someone's"


REFUSED = r"""
import os, resource, signal, sys
from tpubuild.fs import copy_hashed, place
place.COPY_STEP = 1 << 20
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))
try:
    copy_hashed(sys.argv[1], sys.argv[2])
except OSError as exc:
    print(exc.errno)
"""


def test_a_write_the_file_system_refuses_is_raised_not_hashed_past(tmp_path: Path) -> None:
    """The kernel's refusal of a step on the copying thread (EFBIG past a file size limit,
    as ENOSPC on a full disk) is raised by copy_hashed itself, not a digest of the part."""
    import errno

    from tests.cli import REPO

    (tmp_path / "src").write_bytes(os.urandom(8 << 20))
    done = subprocess.run([sys.executable, "-c", REFUSED, str(tmp_path / "src"), str(tmp_path / "copy")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(errno.EFBIG), (done.stdout, done.stderr)


def test_the_copying_threads_io_is_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source row's io (engine/loop.py, this thread's counters) holds the copy the
    helper thread made: its writes are charged to the caller (io_counters.charge)."""
    from tpubuild import io_counters

    monkeypatch.setattr(place, "COPY_STEP", 1 << 20)
    size = 6 << 20
    (tmp_path / "src").write_bytes(os.urandom(size))
    before = io_counters.read(io_counters.THREAD)
    if before is None:
        pytest.skip("no /proc/thread-self/io on this kernel")
    copy_hashed(tmp_path / "src", str(tmp_path / "copy"))
    grown = io_counters.since(before, io_counters.THREAD)
    assert grown is not None and grown["wchar"] >= size and grown["rchar"] >= size, grown
