"""Two real Unix users sharing one cache (issue 39): a victim and a co-user in one group,
umask 002, the cache made as docs/shared-cache.md says (mode 2775). The test process is
root (as in CI) and runs each user's commands in processes of that uid, which need no
/etc/passwd entry (HOME is a directory the user owns). Tests skip, saying why, where
users cannot be made (not root) or no Python runs as another uid."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli import REPO

ROOT_ONLY = "two real users need root (to run processes as other uids)"


def _free_ids(start: int) -> tuple[int, int, int]:
    """A group id and two user ids no account or group of this machine uses."""
    def free_uid(n: int) -> bool:
        try:
            pwd.getpwuid(n)
        except KeyError:
            return True
        return False

    def free_gid(n: int) -> bool:
        try:
            grp.getgrgid(n)
        except KeyError:
            return True
        return False

    n = start
    while not (free_gid(n) and free_uid(n + 1) and free_uid(n + 2)):
        n += 10
    return n, n + 1, n + 2


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class TwoUsers:
    """`victim` and `co` (the co-user), both in group `gid`; `base` is a directory both
    can enter; `python` an interpreter both can run, with `pythonpath` its import path."""

    base: Path
    gid: int
    victim: User
    co: User
    python: str
    pythonpath: str

    def env(self, user: User, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {"HOME": str(user.home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": self.pythonpath}
        return {**env, **(extra or {})}

    def run(self, user: User, argv: list[str], cwd: Path | None = None, extra: dict[str, str] | None = None,
            timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`argv` with this suite's Python as `user` (umask 002, the group as its own)."""
        return subprocess.run([self.python, *argv], cwd=cwd or self.base, user=user.uid, group=self.gid,
                              extra_groups=[self.gid], umask=0o002, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else self.env(user, extra))

    def popen(self, user: User, argv: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen([self.python, *argv], cwd=self.base, user=user.uid, group=self.gid,
                                extra_groups=[self.gid], umask=0o002, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(user, extra))

    def tpubuild(self, user: User, ws: Path, *args: str, extra: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run(user, ["-m", "tpubuild", *args], cwd=ws, extra=extra, timeout=timeout)

    def shared_cache(self, name: str = "cache") -> Path:
        """A cache directory as docs/shared-cache.md makes it: the group's, mode 2775."""
        cache = self.base / name
        cache.mkdir()
        os.chown(cache, 0, self.gid)
        os.chmod(cache, 0o2775)
        return cache

    def give(self, path: Path, user: User) -> Path:
        """`path` and everything below it made `user`'s."""
        for dirpath, _dirs, files in os.walk(path):
            os.chown(dirpath, user.uid, self.gid)
            for name in files:
                os.chown(os.path.join(dirpath, name), user.uid, self.gid, follow_symlinks=False)
        return path


def _interpreter(uid: int, gid: int) -> tuple[str, str] | None:
    """(python, PYTHONPATH) another uid can run with this suite's packages and tpubuild:
    this interpreter when that uid can execute it, else the system's of the same minor
    version with this environment's site-packages on its path."""
    path = os.pathsep.join([str(REPO), *site.getsitepackages()])
    probe = "import blake3, yaml, tpubuild.store.store"
    candidates = [sys.executable, shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}",
                                               path="/usr/bin:/bin:/usr/local/bin")]
    for python in [c for c in candidates if c]:
        try:
            result = subprocess.run([python, "-c", probe], user=uid, group=gid, capture_output=True, timeout=60,
                                    env={"PYTHONPATH": path, "HOME": "/", "PATH": "/usr/bin:/bin"}, cwd="/")
        except (OSError, subprocess.SubprocessError):
            continue
        if result.returncode == 0:
            return python, path
    return None


@pytest.fixture
def two_users(tmp_path_factory) -> TwoUsers:
    if os.geteuid() != 0:
        pytest.skip(ROOT_ONLY)
    gid, victim_uid, co_uid = _free_ids(41000)
    found = _interpreter(victim_uid, gid)
    if found is None:
        pytest.skip("no Python interpreter with this suite's packages can run as another uid")
    # Not under pytest's own temp root: it is 0700, so no other user could enter it.
    base = Path(tempfile.mkdtemp(prefix="tpubuild-two-users-"))
    os.chmod(base, 0o755)
    users = []
    for name, uid in (("victim", victim_uid), ("co", co_uid)):
        home = base / f"home-{name}"
        home.mkdir()
        os.chown(home, uid, gid)
        os.chmod(home, 0o700)
        users.append(User(name, uid, gid, home))
    yield TwoUsers(base, gid, users[0], users[1], *found)
    shutil.rmtree(base, ignore_errors=True)
