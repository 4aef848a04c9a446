"""Issue 46 item 11: a directory 5000 levels deep planted in a shared cache (under
`trees/`, `tmp/`, `objects/zz/`, inside a checkout) is damage like any other: every build,
`gc` and `verify-cache` goes on, removes it (iteratively, by descriptor: fs/nofollow.py
remove_at), and says so in one line where it says damage; what cannot be removed is left
with one line, never a RecursionError."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.engine import users as shared
from tests.engine.conftest import built_once, built_workspace, tiny_saved_model  # noqa: F401 (fixtures)

two_users = shared.two_users  # the fixture: two real users and a shared cache

DEPTH = 5000


def plant(parent: Path, name: str, depth: int = DEPTH, locked: bool = False) -> Path:
    """`parent/name/d/d/.../d/f`, `depth` directories deep, made by descriptor (its path is
    longer than PATH_MAX); `locked`: its bottom directory writable by its owner alone. The
    co-user's script (PLANT) runs this same function."""
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
    if locked:
        os.fchmod(current, 0o755)
    os.close(current)
    return parent / name


def unplant(paths: list[Path]) -> None:
    """Remove what a failed run left (by GNU rm, which walks any depth; not tpubuild, whose
    removal is what is under test): pytest's own clean-up of its temp root (shutil.rmtree,
    recursive in Python 3.11) would meet RecursionError there."""
    import subprocess

    left = [os.fspath(p) for p in paths if os.path.lexists(p)]
    if left:
        subprocess.run(["rm", "-rf", "--", *left], check=False)


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_a_deep_directory_planted_in_the_cache_is_removed_by_build_gc_and_verify_cache(built_workspace):
    ws = built_workspace
    v1 = ws / ".tpubuild" / "cache" / "v1"
    (v1 / "objects" / "zz").mkdir(exist_ok=True)
    planted = [plant(v1 / "tmp", "deep"), plant(v1 / "trees", "deep"), plant(v1 / "objects" / "zz", "deep")]
    (ws / "recipes" / "toy.yaml").write_text((ws / "recipes" / "toy.yaml").read_text() + "# touched\n")
    try:
        for command in (["build"], ["gc", "--keep-days", "0"], ["verify-cache"]):
            done = tpubuild(ws, *command, timeout=600)
            assert done.returncode == 0, (command, done.stderr)
            assert "RecursionError" not in done.stderr and "Traceback" not in done.stderr, (command, done.stderr)
        assert [p for p in planted if os.path.lexists(p)] == []
    finally:
        unplant(planted)


def test_the_removal_and_the_walk_are_iterative_and_bounded(tmp_path):
    from tpubuild.errors import StageError
    from tpubuild.fs.nofollow import MAX_DEPTH, remove_at, walk_regular

    deep = plant(tmp_path, "deep")
    try:
        fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
        try:
            walk_regular(fd, str(deep))
        except StageError as exc:
            assert str(exc) == f"{deep}/{'/'.join(['d'] * (MAX_DEPTH + 1))}: more than {MAX_DEPTH} directory " \
                               "levels deep; not entered"
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
    finally:
        unplant([deep])


# The victim's gc and verify-cache of the shared cache, warnings on stdout.
GC = """
import sys
from pathlib import Path
from tpubuild.store.gc import collect
from tpubuild.store.store import Store
store = Store(Path(sys.argv[1]), report=print)
collect(store, set(), 0, None)
store.verify_all()
print("done")
"""

# What the co-user plants: deep directories under tmp/, trees/ and objects/zz/ (group-
# writable, umask 002), and one under objects/zz/ whose bottom the victim cannot write.
PLANT = f"""
from __future__ import annotations
import os, sys
from pathlib import Path
DEPTH = {DEPTH}
{inspect.getsource(plant)}
v1 = Path(sys.argv[1]) / "v1"
os.makedirs(v1 / "objects" / "zz", exist_ok=True)
for parent, name in (("tmp", "deep"), ("trees", "deep"), ("objects/zz", "deep")):
    plant(v1 / parent, name)
plant(v1 / "objects" / "zz", "locked", locked=True)
print("planted")
"""


def test_a_co_users_deep_directory_is_removed_and_what_cannot_be_is_one_line(two_users):
    from tests.engine.test_shared_cache import FILES, KEY, PUT

    users = two_users
    cache = users.shared_cache()
    made = users.run(users.victim, ["-c", PUT, str(cache), KEY, json.dumps(FILES)])
    assert made.returncode == 0, made.stderr
    planted = users.run(users.co, ["-c", PLANT, str(cache)], timeout=300)
    assert planted.stdout.strip() == "planted", planted.stderr
    v1 = cache / "v1"
    try:
        _victims_gc(users, cache, v1)
    finally:
        unplant([v1 / "tmp" / "deep", v1 / "trees" / "deep", v1 / "objects" / "zz" / "deep",
                 v1 / "objects" / "zz" / "locked"])


def _victims_gc(users, cache: Path, v1: Path) -> None:
    done = users.run(users.victim, ["-c", GC, str(cache)], timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert not os.path.lexists(v1 / "tmp" / "deep") and not os.path.lexists(v1 / "trees" / "deep")
    assert not os.path.lexists(v1 / "objects" / "zz" / "deep")
    assert os.path.lexists(v1 / "objects" / "zz" / "locked")  # the co-user's own: left
    assert [line for line in done.stdout.splitlines() if "zz/locked" in line] == [
        f"warning: cache object {v1}/objects/zz/locked is a directory; cannot remove all of it (another user's?): "
        "left in place"], done.stdout
    assert done.stdout.splitlines()[-1] == "done"
