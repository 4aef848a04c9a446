"""Issue 39: a shared cache that works for a second user and that no co-user can turn
against you. Two real Unix users (tests/engine/users.py) share a cache made as
docs/shared-cache.md says (group-writable, 2775, umask 002); each finding's reproduction
is rerun here against the store and, where a whole build is needed, the real CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine import users as shared
from tests.engine.conftest import source_recipe, write_workspace
from tests.engine.users import TwoUsers
from tpubuild.report.formats import human_bytes

two_users = shared.two_users  # the fixture: two real users and a shared cache
KEY = "a" * 64
SHARED_LINE = "can be written by the users of group"

# The victim's stage output, stored and checked out (as the engine does after a stage).
PUT = """
import json, sys
from pathlib import Path
from tpubuild.digests.statcache import StatCache
from tpubuild.store.store import Store
store = Store(Path(sys.argv[1]))
out = store.new_workdir("stage") / "out"
for rel, text in json.loads(sys.argv[3]).items():
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text(text)
entry = store.put(sys.argv[2], "stage", out, {}, [], {}, StatCache(None))
print(store.checkout(entry))
"""

# The victim's next build using that record: looked up, verified, checked out.
CHECKOUT = """
import sys
from pathlib import Path
from tpubuild.digests.statcache import StatCache
from tpubuild.store.store import Store
store = Store(Path(sys.argv[1]))
entry = store.get(sys.argv[2])
assert entry is not None and store.verify(entry, StatCache(None))
tree = store.checkout(entry)
print(tree)
print(sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()))
"""

FILES = {"saved_model.pb": "model", "variables/variables.index": "index"}


def _victims_directory(users: TwoUsers) -> tuple[Path, dict[str, str]]:
    """A directory of the victim's own, outside the cache, with files a checkout does not list."""
    mine = users.victim.home / "thesis"
    (mine / "sub").mkdir(parents=True)
    (mine / "thesis.txt").write_text("years of work")
    (mine / "sub" / "notes.txt").write_text("notes")
    users.give(mine, users.victim)
    return mine, {"thesis.txt": "years of work", "sub/notes.txt": "notes"}


def _contents(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): p.read_text() for p in directory.rglob("*") if p.is_file()}


def test_finding_1_a_link_in_trees_is_removed_and_what_it_points_to_is_never_touched(two_users):
    users = two_users
    cache = users.shared_cache()
    mine, theirs = _victims_directory(users)
    made = users.run(users.victim, ["-c", PUT, str(cache), KEY, json.dumps(FILES)])
    assert made.returncode == 0, made.stderr
    tree = Path(made.stdout.strip())
    # The co-user replaces the checkout (its name is listable) by a link to the victim's directory.
    swap = f"import os; os.rename({str(tree)!r}, {str(tree)!r} + '.old'); os.symlink({str(mine)!r}, {str(tree)!r})"
    assert users.run(users.co, ["-c", swap]).returncode == 0
    used = users.run(users.victim, ["-c", CHECKOUT, str(cache), KEY])
    assert used.returncode == 0, used.stderr
    assert _contents(mine) == theirs  # before issue 39: thesis.txt and sub/notes.txt deleted, objects linked in
    assert [line for line in used.stderr.splitlines() if "warning: cache" in line] == [
        f"warning: cache {tree} is a symbolic link, not what tpubuild keeps there; removed (the link itself, not what "
        "it points to)"]
    assert not tree.is_symlink() and _contents(tree) == FILES
    # A link inside a checkout: the walk never enters it, the checkout is set aside and made again.
    inner = tree / "variables"
    swap = f"import os; os.rename({str(inner)!r}, {str(inner)!r} + '.old'); os.symlink({str(mine)!r}, {str(inner)!r})"
    assert users.run(users.co, ["-c", swap]).returncode == 0
    used = users.run(users.victim, ["-c", CHECKOUT, str(cache), KEY])
    assert used.returncode == 0, used.stderr
    assert _contents(mine) == theirs
    assert [line for line in used.stderr.splitlines() if "warning: cache" in line] == [
        f"warning: cache checkout {tree} holds a symbolic link at {inner}; set aside and made again (never followed)"]
    assert not inner.is_symlink() and _contents(tree) == FILES


# The victim's stage writes its output, then waits (stdin) while the co-user acts.
STAGE = """
import sys
from pathlib import Path
from tpubuild.digests.statcache import StatCache
from tpubuild.store.store import Store
from tpubuild.errors import StageError
store = Store(Path(sys.argv[1]))
work = store.new_workdir("export")
(work / "out").mkdir()
(work / "out" / "saved_model.pb").write_text("the victim's model")
print(work, flush=True)
sys.stdin.readline()
try:
    entry = store.put("k" * 64, "export", work / "out", {}, [], {}, StatCache(None))
    print("stored", [store.object_path(f.hash).read_text() for f in entry.files])
except StageError as exc:
    print("refused", exc)
print("record", store.get("k" * 64) is not None)
"""

# What the co-user does to the victim's session: their own output, in its place.
SWAP = """
import os, sys
from pathlib import Path
from tpubuild.digests.hashing import hash_bytes
work, target = Path(sys.argv[1]), Path(sys.argv[2])
aside = Path(str(target) + ".aside")
try:
    os.rename(target, aside)
except OSError as exc:
    print("rename", type(exc).__name__)
    sys.exit()
(work / "out").mkdir(parents=True)
(work / "out" / "saved_model.pb").write_text("EVIL")
digest = hash_bytes(b"EVIL")  # and the same bytes as an object: put finds it and moves nothing
obj = Path(sys.argv[3]) / "v1" / "objects" / digest[:2] / digest[2:]
obj.parent.mkdir(parents=True, exist_ok=True)
obj.write_text("EVIL")
print("swapped")
"""


def _stage_with_co_user_acting(users: TwoUsers, cache: Path, target: str) -> tuple[str, str]:
    """(what the co-user's swap of `target` ("work" or "session") said, what the victim's
    put said)."""
    stage = users.popen(users.victim, ["-c", STAGE, str(cache)])
    try:
        work = Path(stage.stdout.readline().strip())
        swapped = users.run(users.co, ["-c", SWAP, str(work), str(work if target == "work" else work.parent),
                                       str(cache)])
        out, err = stage.communicate("go\n", timeout=60)
    finally:
        stage.kill()
    assert stage.returncode == 0, err
    return swapped.stdout.strip(), out


def test_finding_3_no_other_user_can_enter_or_swap_a_session(two_users):
    users = two_users
    cache = users.shared_cache()
    # The work directory is in the victim's 0700 session; the session is in a sticky tmp/.
    said, out = _stage_with_co_user_acting(users, cache, "work")
    assert said == "rename PermissionError"
    assert out.splitlines() == ["stored [\"the victim's model\"]", "record True"]
    said, out = _stage_with_co_user_acting(users, cache, "session")
    assert said == "rename PermissionError"
    tmp = cache / "v1" / "tmp"
    assert stat.S_IMODE(os.stat(tmp).st_mode) == 0o3775


def test_finding_3_a_session_renamed_by_the_owner_of_tmp_is_refused(two_users):
    # The owner of a sticky directory can still rename what is in it: the co-user made
    # v1/tmp first. The victim's put notices its session is no longer under its name and
    # stores nothing; it never reads the co-user's files as its output.
    users = two_users
    cache = users.shared_cache()
    made = users.run(users.co, ["-c", f"import os; os.makedirs('{cache}/v1/tmp'); os.chmod('{cache}/v1/tmp', 0o3775)"])
    assert made.returncode == 0, made.stderr
    said, out = _stage_with_co_user_acting(users, cache, "session")
    assert said == "swapped"
    lines = out.splitlines()
    assert lines[0].startswith("refused the session directory ") and lines[0].endswith(
        " was replaced while the stage ran (by another user of the cache?); its output is not stored"), lines
    assert lines[1:] == ["record False"]


PUT_AND_GET = """
import sys
from pathlib import Path
from tpubuild.digests.statcache import StatCache
from tpubuild.store.store import Store
store = Store(Path(sys.argv[1]))
out = store.new_workdir("stage") / "out"
out.mkdir()
(out / "f").write_text("x")
store.put("b" * 64, "stage", out, {}, [], {}, StatCache(None))
store.close()
second = []  # the next build (its own lines are its own): its records verify
print(Store(Path(sys.argv[1]), report=second.append).get("b" * 64) is not None)
"""


def test_finding_6_a_squatted_key_makes_a_key_of_the_victims_own_and_records_still_verify(two_users):
    users = two_users
    key_dir = users.victim.home / ".config" / "tpubuild" / "keys"
    squats = {
        "their file": f"import os; os.makedirs('{{v1}}/keys'); os.chmod('{{v1}}/keys', 0o1777); "
                      f"fd = os.open('{{v1}}/keys/{users.victim.uid}', os.O_WRONLY | os.O_CREAT, 0o600); "
                      "os.write(fd, os.urandom(32))",
        "keys/ theirs": "import os; os.makedirs('{v1}/keys'); os.chmod('{v1}/keys', 0o2755)",
    }
    for name, squat in squats.items():
        cache = users.shared_cache(f"cache-{len(name)}")
        v1 = cache / "v1"
        made = users.run(users.co, ["-c", f"import os; os.makedirs('{v1}'); " + squat.format(v1=v1)])
        assert made.returncode == 0, made.stderr
        for _ in range(2):  # every build of the victim: said, and its records verify
            result = users.run(users.victim, ["-c", PUT_AND_GET, str(cache)])
            assert result.returncode == 0, result.stderr
            assert result.stdout.split() == ["True"], (name, result.stderr)
            said = [line for line in result.stderr.splitlines() if "key" in line]
            why = f"{v1}/keys/{users.victim.uid} is not readable by you (it belongs to uid {users.co.uid}, mode 600)" \
                if name == "their file" else \
                f"{v1}/keys is not writable by you (it belongs to uid {users.co.uid}, mode 2755)"
            assert said == [f"warning: {why}: your records in {cache} are MACed with your own key "
                            f"{key_dir}/record-mac.key instead, outside the cache (TPUBUILD_KEY_DIR chooses its "
                            "directory)"], (name, result.stderr)
        st = os.stat(key_dir / "record-mac.key")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (users.victim.uid, 0o600)
    # TPUBUILD_KEY_DIR: always there, nothing said; and a user with no HOME and no passwd
    # entry still builds (nothing is trusted, said once, with advice that can be followed).
    cache = users.shared_cache("cache-own")
    own = users.victim.home / "own-keys"
    result = users.run(users.victim, ["-c", PUT_AND_GET, str(cache)], extra={"TPUBUILD_KEY_DIR": str(own)})
    assert result.returncode == 0 and result.stdout.split() == ["True"], result.stderr
    assert "key" not in result.stderr and (own / "record-mac.key").is_file()
    assert not (cache / "v1" / "keys").exists()
    env = {k: v for k, v in users.env(users.victim).items() if k != "HOME"}
    made = users.run(users.co, ["-c", f"import os; os.makedirs('{cache}/v1/keys', exist_ok=True); "
                                      f"os.chmod('{cache}/v1/keys', 0o2755)"])
    assert made.returncode == 0, made.stderr
    result = users.run(users.victim, ["-c", PUT_AND_GET, str(cache)], env=env)
    assert result.returncode == 0 and result.stdout.split() == ["False"], result.stderr
    assert [line for line in result.stderr.splitlines() if "key" in line] == [
        f"warning: {cache}/v1/keys is not writable by you (it belongs to uid {users.co.uid}, mode 2755); no "
        "directory for a key of yours (set TPUBUILD_KEY_DIR, or HOME): no stage record of the cache "
        f"{cache} is trusted by this build (every stage rebuilds); set TPUBUILD_KEY_DIR to a directory only you "
        "can write"]


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""

OPEN_SESSION = """
import sys, time
from pathlib import Path
from tpubuild.store.store import Store
from tpubuild.errors import UsageError
start = time.monotonic()
try:
    Store(Path(sys.argv[1]), report=lambda m: print("said:", m)).session_dir()
    print("opened")
except UsageError as exc:
    print("error:", exc)
print(f"after {time.monotonic() - start:.1f} s")
"""


def test_finding_7_a_co_user_holding_the_cache_lock_costs_a_deadline_and_is_named(two_users):
    users = two_users
    cache = users.shared_cache()
    first = users.run(users.victim, ["-c", OPEN_SESSION, str(cache)])
    assert next(line for line in first.stdout.splitlines() if SHARED_LINE not in line) == "opened", first.stdout
    lock = cache / "v1" / "lock"
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o664  # every user of the cache can flock it
    holder = users.popen(users.co, ["-c", HOLD, str(lock)])
    try:
        assert holder.stdout.readline().strip() == "held"
        result = users.run(users.victim, ["-c", OPEN_SESSION, str(cache)], extra={"TPUBUILD_CACHE_LOCK_WAIT": "1"})
    finally:
        holder.kill()
        holder.wait()
    lines = [line for line in result.stdout.splitlines() if SHARED_LINE not in line]
    held = f"held by pid {holder.pid}, uid {users.co.uid}, python"
    assert lines[0].startswith(f"said: waiting for the cache lock {lock} ({held}"), lines
    assert lines[0].endswith("); giving up after 1 s")
    assert lines[1].startswith(f"error: the cache lock {lock} stayed busy ({held}") and lines[1].endswith(
        "); gave up after 1 s (set TPUBUILD_CACHE_LOCK_WAIT to wait longer)"), lines
    assert float(lines[2].split()[1]) < 10  # before issue 39: waited forever, and said nothing


HOLD_INDEX = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")  # a writer that never commits
print("held", flush=True)
sys.stdin.readline()
"""

REGISTER = """
import sys, time
from pathlib import Path
from tpubuild.store.store import Store
start = time.monotonic()
Store(Path(sys.argv[1]), report=lambda m: print("said:", m)).register_workspace(Path(sys.argv[2]), {"k"},
                                                                                 required=False)
print(f"after {time.monotonic() - start:.1f} s")
"""


def test_finding_7_a_co_user_keeping_the_index_busy_costs_a_deadline_and_is_named(two_users):
    users = two_users
    cache = users.shared_cache()
    assert users.run(users.victim, ["-c", REGISTER, str(cache), str(users.victim.home)]).returncode == 0
    index = cache / "v1" / "index.sqlite"
    holder = users.popen(users.co, ["-c", HOLD_INDEX, str(index)])
    try:
        assert holder.stdout.readline().strip() == "held"
        result = users.run(users.victim, ["-c", REGISTER, str(cache), str(users.victim.home)],
                           extra={"TPUBUILD_CACHE_LOCK_WAIT": "3"})
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    held = f"held by pid {holder.pid}, uid {users.co.uid}, python"
    lines = [line for line in result.stdout.splitlines() if SHARED_LINE not in line]
    assert lines[0].startswith(f"said: waiting for the cache index {index} ({held}") and lines[0].endswith(
        "); giving up after 3 s"), lines
    assert lines[1].startswith(f"said: warning: the cache index {index} cannot be written (kept busy by another "
                               f"process ({held}") and lines[1].endswith(
        ") for 3 s); this build is not registered in it, so `tpubuild gc` run from another workspace may remove "
        "what this one uses"), lines
    assert float(lines[2].split()[1]) < 10


@pytest.mark.slow
def test_finding_5_a_second_user_builds_in_the_documented_shared_cache(two_users, tiny_saved_model):
    users = two_users
    cache = users.shared_cache()
    spaces = {}
    for user in (users.victim, users.co):
        ws = write_workspace(users.base / f"ws-{user.name}", tiny_saved_model, {"toy": source_recipe("toy")})
        with open(ws / "tpubuild.yaml", "a") as f:
            f.write(f"cache_dir: {cache}\n")
        spaces[user.name] = users.give(ws, user)

    def build(user, *args: str) -> tuple[dict, list[str]]:
        result = users.tpubuild(user, spaces[user.name], "build", "--json", *args)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert sum(SHARED_LINE in line for line in result.stderr.splitlines()) == 1, result.stderr
        document = json.loads(result.stdout)
        return {row["stage"]: row["status"] for row in document["rows"]}, result.stderr.splitlines()

    first, _ = build(users.victim)
    assert set(first.values()) == {"built"}
    second, _ = build(users.co)  # before issue 39: "Read-only file system: .../v1/index.sqlite", nothing built
    assert second["publish"] == "built"
    again, _ = build(users.co)
    assert set(again.values()) == {"cached"}
    v1 = cache / "v1"
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in v1.iterdir()}
    assert modes["index.sqlite"] == modes["lock"] == 0o664
    assert all(modes[name] == 0o664 for name in modes if name.startswith("index.sqlite-")), modes
    assert modes["objects"] == modes["stages"] == modes["trees"] == 0o2775 and modes["tmp"] == 0o3775
    assert modes["keys"] == 0o1777
    records = list((v1 / "stages").rglob("*.json"))
    assert records and {stat.S_IMODE(os.stat(p).st_mode) for p in records} == {0o444}
    # The co-user's gc keeps the records it reads (everyone's) and their objects: its counts are true.
    objects = sorted(p for p in (v1 / "objects").rglob("*") if p.is_file())
    result = users.tpubuild(users.co, spaces["co"], "gc")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("removed 0 stage entries and 0 objects (0 B); ")
    assert sorted(p for p in (v1 / "objects").rglob("*") if p.is_file()) == objects
    # An index made by a tpubuild that let sqlite choose its mode (0644, the victim's): the
    # co-user's build says so once, with what its owner can do, and builds.
    for path in v1.glob("index.sqlite*"):
        os.chmod(path, 0o644)
    (spaces["co"] / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=3))
    result = users.tpubuild(users.co, spaces["co"], "build")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "cache index" in line]
    assert said == [f"warning: the cache index {v1 / 'index.sqlite'} is not writable by you (index.sqlite belongs to "
                    f"uid {users.victim.uid}, mode 644; its owner can run `chmod g+w {v1 / 'index.sqlite'}*`); this "
                    "build is not registered in it, so `tpubuild gc` run from another workspace may remove what "
                    "this one uses"], result.stderr
    refused = users.tpubuild(users.co, spaces["co"], "gc")  # it cannot know which workspaces use the cache
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
        f"error: the cache index {v1 / 'index.sqlite'} is not writable by you (index.sqlite belongs to uid "
        f"{users.victim.uid}, mode 644; its owner can run `chmod g+w {v1 / 'index.sqlite'}*`): gc cannot know "
        "which workspaces use the cache; nothing removed"), refused.stderr
    build(users.victim)  # the index's owner: made writable for the group again
    assert stat.S_IMODE(os.stat(v1 / "index.sqlite").st_mode) == 0o664


def test_a_cache_tpubuild_makes_itself_is_private_whatever_the_umask(two_users):
    users = two_users
    cache = users.victim.home / "made-by-tpubuild"
    made = users.run(users.victim, ["-c", PUT_AND_GET, str(cache)])  # umask 002
    assert made.returncode == 0 and made.stdout.split() == ["True"], made.stderr
    assert SHARED_LINE not in made.stderr
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o755 and stat.S_IMODE(os.stat(cache / "v1").st_mode) == 0o755


def test_a_fifo_special_files_and_directories_in_the_cache_are_damage_never_read(tmp_path):
    # One user is enough here: damage in the places of the lock, a session's lock, a record.
    from tpubuild.digests import StatCache
    from tpubuild.store import Store

    said: list[str] = []
    store = Store(tmp_path / "cache", report=said.append)
    out = store.new_workdir("stage") / "out"
    out.mkdir()
    (out / "f").write_text("x")
    entry = store.put(KEY, "stage", out, {}, [], {}, StatCache(None))
    store.close()
    v1 = tmp_path / "cache" / "v1"
    record = v1 / "stages" / KEY[:2] / f"{KEY}.json"
    record.unlink()
    os.mkfifo(record)  # reading it would block forever
    os.unlink(v1 / "lock")
    os.mkfifo(v1 / "lock")
    os.mkfifo(v1 / "tmp" / "dead.lock")
    start = time.monotonic()
    store = Store(tmp_path / "cache", report=said.append)
    assert store.get(KEY) is None
    store.session_dir()
    assert time.monotonic() - start < 5
    assert said == [
        f"warning: cache {record} is a FIFO (named pipe), not what tpubuild keeps there; removed",
        f"warning: cache {v1 / 'lock'} is a FIFO (named pipe), not what tpubuild keeps there; removed",
        f"warning: cache {v1 / 'tmp' / 'dead.lock'} is a FIFO (named pipe), not what tpubuild keeps there; removed",
    ]
    assert (v1 / "lock").is_file() and not os.path.lexists(v1 / "tmp" / "dead.lock")
    assert store.checkout(entry).is_dir()


def test_a_process_that_holds_a_session_is_waited_for_by_gc_naming_it(tmp_path):
    # gc's wait for running builds names them too (the holder of each session's flock).
    from tests.cli import REPO
    from tpubuild.errors import UsageError
    from tpubuild.store import Store

    cache = tmp_path / "cache"
    code = ("import sys; from pathlib import Path; from tpubuild.store.store import Store; "
            "Store(Path(sys.argv[1])).session_dir(); print('open', flush=True); sys.stdin.readline()")

    proc = subprocess.Popen([sys.executable, "-c", code, str(cache)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "open"
        said: list[str] = []
        try:
            with Store(cache).exclusive(wait=0.3, notify=said.append):
                raise AssertionError("the store was taken while a build used it")
        except UsageError as exc:
            assert str(exc).startswith(f"a tpubuild build is still using the cache {cache} (held by pid {proc.pid}, ")
            assert str(exc).endswith("); gave up after 0.3 s")
        assert said == [f"waiting for 1 running tpubuild build(s) using the cache {cache}"]
    finally:
        proc.kill()
        proc.wait()


def _damage_cases(v1: Path) -> dict[str, tuple[Path, str, object]]:
    """label -> (path, what it is, how to make it)."""
    def loop(path: Path) -> None:
        os.symlink(path, path)

    def directory(path: Path) -> None:
        (path / "theirs").mkdir(parents=True)

    return {
        "v1/lock a directory": (v1 / "lock", "a directory", directory),
        "v1/lock a symlink loop": (v1 / "lock", "a symbolic link", loop),
        "tmp/x.lock a directory": (v1 / "tmp" / "x.lock", "a directory", directory),
        "tmp/x.lock a dangling symlink": (v1 / "tmp" / "x.lock", "a symbolic link",
                                          lambda p: os.symlink("/nonexistent", p)),
    }


def test_finding_8_damage_in_the_place_of_a_lock_is_one_warning_in_build_gc_and_verify_cache(built_workspace,
                                                                                          tmp_path):
    from tests.cli import tpubuild

    ws = built_workspace
    v1 = ws / ".tpubuild" / "cache" / "v1"
    for case, (label, (path, what, make)) in enumerate(_damage_cases(v1).items()):
        for command in (["build", "toy"], ["gc"], ["verify-cache"]):
            if path.is_symlink() or path.is_file():
                path.unlink()
            make(path)
            if command[0] == "build":  # publish only (no TensorFlow): opens a session of the store
                (ws / "out" / "toy").rename(tmp_path / f"toy-{case}")
            result = tpubuild(ws, *command, timeout=120)
            assert result.returncode == 0, (label, command, result.stderr)
            assert "Traceback" not in result.stderr  # before issue 39: IsADirectoryError, ELOOP
            how = " (the link itself, not what it points to)" if what == "a symbolic link" else ""
            assert [line for line in result.stderr.splitlines() if line.startswith("warning: cache ")] == [
                f"warning: cache {path} is {what}, not what tpubuild keeps there; removed{how}"], (label, command)
            assert not path.is_symlink() and (path.name == "lock") == path.is_file()


def test_finding_8_gc_and_verify_cache_remove_damage_in_objects_and_count_only_what_they_removed(built_workspace):
    from tests.cli import tpubuild

    ws = built_workspace
    v1 = ws / ".tpubuild" / "cache" / "v1"
    objects = {p: p.stat().st_size for p in (v1 / "objects").rglob("*") if p.is_file()}
    shard = min((v1 / "objects").iterdir())
    dangling, directory, shard_file = shard / ("0" * 62), shard / ("1" * 62), v1 / "objects" / "zz"
    fifo_record = v1 / "stages" / "ff" / ("f" * 64 + ".json")
    for command in (["gc", "--keep-days", "0"], ["verify-cache"]):
        os.symlink("/nonexistent", dangling)
        (directory / "x").mkdir(parents=True)
        shard_file.write_text("not a directory")
        fifo_record.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo_record)  # a record gc could not read: before issue 39 it kept it, reading nothing
        result = tpubuild(ws, *command, timeout=120)
        assert result.returncode == 0, (command, result.stderr)
        assert "Traceback" not in result.stderr  # before issue 39: FileNotFoundError, IsADirectoryError
        warnings = sorted(line for line in result.stderr.splitlines() if line.startswith("warning: cache"))
        expected = [f"warning: cache object {dangling} is a symbolic link; removed, its stage rebuilds",
                    f"warning: cache object {directory} is a directory; removed, its stage rebuilds",
                    f"warning: cache {shard_file} is a regular file, not what tpubuild keeps there; removed"]
        if command[0] == "gc":
            expected.append(f"warning: cache record {fifo_record} is invalid (a FIFO (named pipe)); removed")
            # Every lock file references every record: nothing else goes. Its counts are what it removed.
            assert result.stdout.strip() == f"removed 1 stage entries and 0 objects (0 B); " \
                                            f"{human_bytes(sum(objects.values()))} kept"
        else:
            fifo_record.unlink()
            assert result.stdout.strip().startswith(f"checked {len(objects)} objects and ")
        assert warnings == sorted(expected), result.stderr
        assert {p: p.stat().st_size for p in (v1 / "objects").rglob("*") if p.is_file()} == objects
        assert not any(os.path.lexists(p) for p in (dangling, directory, shard_file, fifo_record))
