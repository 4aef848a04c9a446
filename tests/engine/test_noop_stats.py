"""The no-op memo's stat proof (lock/memo.py), as `tpubuild build` and `build --check`
use it before click is imported (tpubuild/entry.py): every kind of change that can change
an output or a lock file sends the command down the full path, and only the lock files'
inputs decide `--check`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.conftest import REPO, build_json, lock_record, tpubuild
from tpubuild.lock import quick
from tpubuild.lock.memo import (
    MARGIN_NS,
    MEMO_FILE,
    OLD_MEMO_FILE,
    SEP,
    _chunks,
    _digest,
    _listing_dirs,
    stats_digest,
)

STALE = "recipes/{0}.yaml: building would change recipes/{0}.lock.yaml: stage "


@pytest.fixture
def settled(built_workspace) -> Path:
    """A built workspace whose memo proves every recipe up to date (its files older than
    the build that checked them, by the margin the memo asks for)."""
    time.sleep(MARGIN_NS / 1e9 + 0.1)
    build_json(built_workspace)  # the full check, which writes the memo
    assert quick(built_workspace, None) is not None
    assert quick(built_workspace, None, outputs=False) is not None
    return built_workspace


def assert_stale(ws: Path, *recipes: str) -> None:
    """`build --check` (fast paths declined) names each recipe as stale, exit 1."""
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    for recipe in recipes:
        assert any(line.startswith(STALE.format(recipe)) for line in lines), check.stdout


def test_the_executable_answers_a_noop_from_stats_without_click(settled):
    for argv, line in ((["build"], "3 recipes: 16 cached\n"), (["build", "--check"], "3 lock files up to date\n")):
        done = tpubuild(settled, *argv, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert (done.returncode, done.stdout) == (0, line), done.stderr
        imported = {e.split("|")[-1].strip() for e in done.stderr.splitlines() if e.startswith("import time:")}
        assert "tpubuild.lock.memo" in imported and not {"click", "yaml", "tensorflow"} & imported


def test_a_same_size_content_edit_with_its_mtime_put_back_is_seen(settled):
    variables = settled / "recipes" / "models" / "tiny" / "variables" / "variables.data-00000-of-00001"
    st = variables.stat()
    data = bytearray(variables.read_bytes())
    data[-1] ^= 0x40  # another weight, the same size
    variables.write_bytes(bytes(data))
    os.utime(variables, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert variables.stat().st_size == st.st_size and variables.stat().st_mtime_ns == st.st_mtime_ns
    assert quick(settled, None) is None and quick(settled, None, outputs=False) is None
    assert_stale(settled, "toy", "other")


def test_a_new_file_in_a_saved_model_directory_is_seen(settled):
    assets = settled / "recipes" / "models" / "tiny" / "assets"
    assets.mkdir(exist_ok=True)
    (assets / "vocab.txt").write_text("a\n")
    assert quick(settled, None) is None and quick(settled, None, outputs=False) is None
    assert_stale(settled, "toy", "other")


def test_an_allow_listed_variable_is_seen(settled, monkeypatch):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert quick(settled, None) is None and quick(settled, None, outputs=False) is None
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    assert quick(settled, None) is not None


def test_tpubuild_code_is_seen(settled, tmp_path):
    """Other code (here a copy of the package: the same bytes in other files) is not the
    code the memo remembered; an edit of the package with its size and mtime put back
    changes what the memo's guard reads."""
    copy = tmp_path / "code"
    shutil.copytree(REPO / "tpubuild", copy / "tpubuild", ignore=shutil.ignore_patterns("__pycache__"))
    probe = "from pathlib import Path; from tpubuild.lock import quick; print(quick(Path('.'), None) is not None)"

    def proven(pythonpath: Path) -> str:
        return subprocess.run([sys.executable, "-c", probe], cwd=settled, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(pythonpath)}).stdout

    assert proven(REPO) == "True\n"
    assert proven(copy) == "False\n"
    fingerprint = "from tpubuild.keys import package_fingerprint; print(package_fingerprint())"

    def digest() -> str:
        return subprocess.run([sys.executable, "-c", fingerprint], cwd=tmp_path, capture_output=True, text=True,
                              check=True,
                              env={**os.environ, "PYTHONPATH": str(copy)}).stdout

    before = digest()
    stage = copy / "tpubuild" / "stages" / "verify.py"
    st = stage.stat()
    text = stage.read_text()
    stage.write_text(text[:-1] + "#")  # the last newline becomes a comment mark
    os.utime(stage, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert stage.stat().st_size == st.st_size
    assert digest() != before


def test_a_new_recipe_file_is_seen_without_globbing(settled):
    """The memo remembers the listing of every directory the recipe globs read; a new
    recipe changes one (and `tpubuild build` then builds it)."""
    assert quick(settled, None)[1]["dirs"] == [[str(settled), _stat_of(settled)],
                                                [str(settled / "recipes"), _stat_of(settled / "recipes")]]
    (settled / "recipes" / "more.yaml").write_text((settled / "recipes" / "toy.yaml").read_text()
                                                   .replace("name: toy", "name: more"))
    assert quick(settled, None) is None and quick(settled, None, outputs=False) is None
    check = tpubuild(settled, "build", "--check")
    assert (check.returncode, check.stdout) == (
        1, "recipes/more.yaml: building would change recipes/more.lock.yaml: no lock file\n"), check.stderr


def test_a_damaged_output_sends_build_down_the_full_path_but_not_check(settled):
    published = next((settled / "out" / "toy").glob("*/saved_model.pb"))
    st = published.stat()
    data = bytearray(published.read_bytes())
    data[-1] ^= 0x01
    published.write_bytes(bytes(data))
    os.utime(published, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert quick(settled, None) is None  # the build repairs it
    assert quick(settled, None, outputs=False) is not None  # no lock file would change
    check = tpubuild(settled, "build", "--check")
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n"), check.stderr


def test_the_stats_run_from_the_root_and_the_working_directory_is_put_back(settled, tmp_path, monkeypatch):
    """quick stats the memo's paths from the workspace root as working directory (no
    dir_fd per stat): from a subdirectory, from outside with the workspace named, proven
    or not, the caller's working directory is the same afterwards."""
    below = settled / "recipes" / "models"
    monkeypatch.chdir(below)
    assert quick(below, None) is not None and os.getcwd() == str(below)
    monkeypatch.chdir(tmp_path)
    assert quick(tmp_path, settled) is not None and os.getcwd() == str(tmp_path)
    weights = settled / "recipes" / "models" / "tiny" / "variables" / "variables.index"
    st = weights.stat()
    weights.write_bytes(weights.read_bytes())  # the same bytes: only its ctime tells
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert quick(tmp_path, settled) is None and os.getcwd() == str(tmp_path)
    monkeypatch.chdir(below)
    assert quick(below, None, outputs=False) is None and os.getcwd() == str(below)


def test_a_rewritten_stage_record_sends_build_down_the_full_path_but_not_check(settled):
    """Stage records are outputs (in the store, not deciding a lock file): one rewritten
    in place with its mtime put back is seen by `build`'s proof, not asked by --check's."""
    record = lock_record(settled, "toy")
    st = record.stat()
    record.write_bytes(record.read_bytes())
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert quick(settled, None) is None
    assert quick(settled, None, outputs=False) is not None


def test_a_memo_cut_short_proves_nothing(settled):
    """The path lists are read by the sizes the header gives: a memo cut inside them (a
    disk full on another writer's copy) is not a proof; the full path writes a new one."""
    memo = settled / ".tpubuild" / MEMO_FILE
    data = memo.read_bytes()
    memo.write_bytes(data[:data.index(b"\n") + 100])
    assert quick(settled, None) is None and quick(settled, None, outputs=False) is None
    done = tpubuild(settled, "build")
    assert (done.returncode, done.stdout) == (0, "3 recipes: 16 cached\n"), done.stderr


def test_the_memo_of_the_schema_before_is_removed_by_the_next_full_check(settled):
    """The JSON memo an older tpubuild wrote (nothing reads it now) does not stay behind."""
    old = settled / ".tpubuild" / OLD_MEMO_FILE
    old.write_text('{"schema": 2}\n{}\n')
    (settled / "recipes" / "toy.yaml").touch()  # the next build takes the full path, which saves the memo
    done = tpubuild(settled, "build")
    assert done.returncode == 0, done.stderr
    assert not old.exists() and (settled / ".tpubuild" / MEMO_FILE).is_file()


def test_every_path_of_a_list_is_stated_once_in_order_whatever_the_pieces(tmp_path, monkeypatch):
    """The no-op stats a list a piece at a time: no path is lost or doubled at a cut, and
    the digest is the one the memo computed from the stats it remembered, in one piece."""
    names = [f"d{i % 7}/{'x' * (i % 13)}f{i}" for i in range(500)]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    blob = b"".join(os.fsencode(n) + SEP for n in names)
    for size in (1, 9, 100, 1 << 16):
        assert [p for piece in _chunks(blob, size) for p in piece] == [os.fsencode(n) for n in names]
    monkeypatch.chdir(tmp_path)
    remembered = [[st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] for st in map(os.stat, names)]
    assert stats_digest(blob) == _digest([remembered])
    (tmp_path / names[-1]).write_text("changed")  # the last path of the list
    assert stats_digest(blob) != _digest([remembered])
    (tmp_path / names[0]).unlink()
    assert stats_digest(blob) is None


def test_directories_changed_within_the_margin_are_not_remembered(tmp_path):
    """A listing remembered by stat must not change again within a timestamp's grain."""
    for team in ("a", "b"):
        (tmp_path / "teams" / team).mkdir(parents=True)
    (tmp_path / "teams" / ".hidden").mkdir()
    assert _listing_dirs(tmp_path, ["teams/*/*.yaml"], time.time_ns()) is None
    dirs = _listing_dirs(tmp_path, ["teams/*/*.yaml"], time.time_ns() + MARGIN_NS + 10**9)
    assert [path for path, _ in dirs] == [str(tmp_path), *(str(tmp_path / "teams" / t) for t in ("", ".hidden", "a", "b"))]
    assert _listing_dirs(tmp_path, ["teams/**/*.yaml"], time.time_ns() + MARGIN_NS + 10**9) is None


def _stat_of(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


FORKED = """
import os, sys
from tpubuild.lock import memo
forks = []
real_fork = os.fork
def counting_fork():
    forks.append(1)
    return real_fork()
os.fork = counting_fork  # counted, then the real fork: the child stats for real
memo.PARALLEL_MIN_PATHS = int(sys.argv[1])
from tpubuild.entry import fast_noop
line = fast_noop(None)
print(repr(line), len(forks), os.getpid())
"""


def _fast_noop_in_a_process(ws: Path, min_paths: int) -> tuple[str, int]:
    """(the executable's no-op line or 'None', how many forks) in a fresh single-threaded
    process, the outputs list checked by a child whenever it holds `min_paths` paths."""
    out = subprocess.run([sys.executable, "-c", FORKED, str(min_paths)], cwd=ws, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout.split()
    return out[0] if out[0] == "None" else " ".join(out[:-2]), int(out[-2])


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def test_a_child_checks_the_outputs_and_its_no_is_heard(settled):
    """With two CPUs the outputs list is stat'ed by a forked child while the process stats
    the inputs (lock/memo.py _lists_hold): its yes proves the no-op, a damaged published
    file is its no, and the full path decides."""
    forks = 1 if _cpus() >= 2 else 0
    assert _fast_noop_in_a_process(settled, 1) == ("'3 recipes: 16 cached'", forks)
    assert _fast_noop_in_a_process(settled, 10**9) == ("'3 recipes: 16 cached'", 0)  # too short to fork for
    published = next((settled / "out" / "toy").glob("*/saved_model.pb"))
    st = published.stat()
    published.write_bytes(published.read_bytes())  # the same bytes: only its ctime tells
    os.utime(published, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _fast_noop_in_a_process(settled, 1) == ("None", forks)
    assert _fast_noop_in_a_process(settled, 10**9) == ("None", 0)


HOLD = """
import os, sys
from tpubuild.lock import memo
os.chdir(sys.argv[1])
lists = [(open(name, "rb").read(), digest) for name, digest in zip(("first.list", "second.list"), sys.argv[2:])]
print(memo._fork_is_safe(), memo._hold_in_two(*lists), memo._lists_hold(lists))
"""


@pytest.mark.parametrize("change", [None, "first", "second", "second-gone", "first-gone"])
def test_two_processes_answer_what_one_does(tmp_path, change):
    """_hold_in_two, whichever list changed (the child's or this process's), says what
    the one-process check says; a path gone is a no from either side."""
    root = tmp_path / "ws"
    lists = {}
    for side in ("first", "second"):
        names = [f"{side}/d{i % 5}/f{i}" for i in range(1200)]
        for name in names:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(name)
        lists[side] = (b"".join(os.fsencode(n) + SEP for n in names), _digest([[_stat_of(root / n) for n in names]]))
        (root / f"{side}.list").write_bytes(lists[side][0])  # not in either list
    if change is not None:
        victim = root / change.split("-")[0] / "d4" / "f1199"
        if change.endswith("gone"):
            victim.unlink()
        else:
            victim.write_text("changed")
    out = subprocess.run([sys.executable, "-c", HOLD, str(root), lists["first"][1], lists["second"][1]],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                         check=True).stdout.split()
    same = "True" if change is None else "False"
    assert out == [str(_cpus() >= 2), same, same]
