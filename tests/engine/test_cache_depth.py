"""Issue 46 item 11: a directory 5000 levels deep planted in a shared cache (under
`trees/`, `tmp/`, `objects/zz/`, inside a checkout) is damage like any other: every build,
`gc` and `verify-cache` goes on, removes it (iteratively, by descriptor: fs/nofollow.py
remove_at), and says so in one line where it says damage; what cannot be removed is left
with one line, never a RecursionError."""

from __future__ import annotations

import os
from pathlib import Path

from tests.engine.conftest import (  # noqa: F401 (fixtures)
    built_once,
    built_workspace,
    tiny_saved_model,
    tpubuild,
)

DEPTH = 5000


def plant(parent: Path, name: str, depth: int = DEPTH) -> Path:
    """`parent/name/d/d/.../d/f`, `depth` directories deep, made by descriptor (its path is
    longer than PATH_MAX)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir(name, dir_fd=fd)
    current = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    for _ in range(depth - 1):
        os.mkdir("d", dir_fd=current)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        os.close(current)
        current = child
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=current))
    os.close(current)
    return parent / name


def test_a_deep_directory_planted_in_the_cache_is_removed_by_build_gc_and_verify_cache(built_workspace):
    ws = built_workspace
    v1 = ws / ".tpubuild" / "cache" / "v1"
    (v1 / "objects" / "zz").mkdir(exist_ok=True)
    planted = [plant(v1 / "tmp", "deep"), plant(v1 / "trees", "deep"), plant(v1 / "objects" / "zz", "deep")]
    (ws / "recipes" / "toy.yaml").write_text((ws / "recipes" / "toy.yaml").read_text() + "# touched\n")
    for command in (["build"], ["gc", "--keep-days", "0"], ["verify-cache"]):
        done = tpubuild(ws, *command, timeout=600)
        assert done.returncode == 0, (command, done.stderr)
        assert "RecursionError" not in done.stderr and "Traceback" not in done.stderr, (command, done.stderr)
    assert [p for p in planted if os.path.lexists(p)] == []


def test_the_removal_and_the_walk_are_iterative_and_bounded(tmp_path):
    from tpubuild.errors import StageError
    from tpubuild.fs.nofollow import MAX_DEPTH, remove_at, walk_regular

    deep = plant(tmp_path, "deep")
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk_regular(fd, str(deep))
    except StageError as exc:
        assert str(exc) == f"{deep}/{'/'.join(['d'] * (MAX_DEPTH + 1))}: more than {MAX_DEPTH} directory levels deep; " \
                           "not entered"
    else:
        raise AssertionError("a directory deeper than MAX_DEPTH was walked")
    finally:
        os.close(fd)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept\n")
    os.symlink(outside, deep / "d" / "link")  # never followed by the removal
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_at("deep", parent) is True
    finally:
        os.close(parent)
    assert not os.path.lexists(deep) and (outside / "keep.txt").read_text() == "kept\n"
