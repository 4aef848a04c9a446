"""Local stage records bound to the user whose tpubuild wrote them: a MAC with a secret key.

A record says which objects a stage key produced. Whoever can write the cache directory
can rewrite one (same key, same path) to list other objects that are in the cache with
correct hashes (their own model's), and every check in records.py still passes: nothing
tied a record's output to its key. So each record carries `mac`, HMAC-SHA256 of its other
fields under a secret key of the user who wrote it, and a record is used only if its MAC
verifies with this user's key (docs/shared-cache.md has the threat model).

The key: 32 random bytes in `<cache>/v1/keys/<uid>`, created on the first record this
user writes there, mode 0600, readable only by its owner (as ccache and Bazel keep their
own files). It is used only if it is a regular file (opened without following a link),
owned by this user, readable by no one else. One key per user and cache: the workspaces
of one user that share a cache reuse one another's records; a record another user wrote
does not verify, so it is rebuilt (and overwritten) by this user's build. `keys/` of a
cache several users share is sticky and world-writable like /tmp: each user can add their
own key and delete no one else's.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any

from tpubuild.atomic import fsync_path

KEY_BYTES = 32
FIELD = "mac"


class KeyProblem(Exception):
    """This user's key exists but cannot be trusted (its path and why)."""


def key_path(root: Path) -> Path:
    """This user's key in the cache layout directory `root` (`<cache>/v1`)."""
    return Path(root) / "keys" / str(os.getuid())


def read_key(root: Path) -> bytes | None:
    """This user's key, or None when there is none yet; KeyProblem when the file there is
    not one this user alone could have written (a link, another user's, readable by others)."""
    path = key_path(root)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KeyProblem(f"{path} is a symbolic link") from None
        raise KeyProblem(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyProblem(f"{path} is not a regular file")
        if st.st_uid != os.getuid():
            raise KeyProblem(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
        if st.st_mode & 0o077:
            raise KeyProblem(f"{path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise KeyProblem(f"{path} holds {len(key)} bytes, not a {KEY_BYTES}-byte key")
    return key


def create_key(root: Path, shared: bool) -> bytes:
    """This user's key, made now if there is none (durable before first use: a record
    MACed with a key that a crash lost would only be rebuilt, but never trusted wrongly)."""
    key = read_key(root)
    if key is not None:
        return key
    path = key_path(root)
    keys = path.parent
    try:
        keys.mkdir(parents=True)
        # A cache several users share: each adds their own key, none can remove another's.
        os.chmod(keys, 0o1777 if shared else 0o700)
    except FileExistsError:
        pass
    tmp = keys / f".{os.getuid()}-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # create-only: a concurrent build of this user may have made it first
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_path(keys)
    key = read_key(root)
    assert key is not None
    return key


def _payload(data: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in data.items() if k != FIELD}, sort_keys=True).encode()


def seal(data: dict[str, Any], key: bytes) -> dict[str, Any]:
    """`data` (a record's JSON document) with its MAC."""
    return {**data, FIELD: hmac.new(key, _payload(data), hashlib.sha256).hexdigest()}


def verifies(data: dict[str, Any], key: bytes | None) -> bool:
    """Whether `data` carries a MAC made with `key`."""
    mac = data.get(FIELD)
    if key is None or not isinstance(mac, str):
        return False
    return hmac.compare_digest(mac, hmac.new(key, _payload(data), hashlib.sha256).hexdigest())
