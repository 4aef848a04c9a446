"""Local stage records bound to the user whose tpubuild wrote them: a MAC with a secret key.

A record says which objects a stage key produced. Whoever can write the cache directory
can rewrite one (same key, same path) to list other objects that are in the cache with
correct hashes (their own model's), and every check in records.py still passes: nothing
tied a record's output to its key. So each record carries `mac`, HMAC-SHA256 of its other
fields under a secret key of the user who wrote it, and a record is used only if its MAC
verifies with this user's key (docs/shared-cache.md has the threat model).

The key: 32 random bytes, mode 0600, readable only by its owner (as ccache and Bazel keep
their own files), used only if it is a regular file (opened without following a link),
owned by this user, readable by no one else. Where:
- `<cache>/v1/keys/<uid>`, made on the first record this user writes there. `keys/` of a
  cache several users share is sticky and writable by all, like /tmp: each user adds their
  own key and can delete no one else's. One key per user and cache: the workspaces of one
  user that share a cache reuse one another's records; a record another user wrote does
  not verify, so it is rebuilt (and overwritten) by this user's build.
- this user's own key directory, outside any cache: `$TPUBUILD_KEY_DIR` when set (then
  always), else, when the key in the cache cannot be trusted or made (another user made
  `keys/<uid>` first, or `keys/` itself, not writable by you: a squatted name that only
  its maker can remove), `$XDG_CONFIG_HOME/tpubuild/keys` or `~/.config/tpubuild/keys`.
  One key for every cache that uses it (`record-mac.key`).
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

KEY_BYTES = 32
FIELD = "mac"
KEY_DIR_VARIABLE = "TPUBUILD_KEY_DIR"
USER_KEY_FILE = "record-mac.key"


class KeyProblem(Exception):
    """This user's key exists but cannot be trusted (its path and why)."""


def key_path(root: Path) -> Path:
    """This user's key in the cache layout directory `root` (`<cache>/v1`)."""
    return Path(root) / "keys" / str(os.getuid())


def read_key(keys_fd: int, display: Path, name: str | None = None) -> bytes | None:
    """This user's key `name` (default: their uid) in the directory `keys_fd` (`display`
    is its path, for messages), or None when there is none yet; KeyProblem when the file
    there is not one this user alone could have written (a link, another user's, readable
    by others)."""
    name = name or str(os.getuid())
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=keys_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KeyProblem(f"{display} is a symbolic link") from None
        if exc.errno == errno.EACCES:
            raise KeyProblem(f"{display} is not readable by you ({_owner(keys_fd, name)})") from None
        raise KeyProblem(f"{display}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyProblem(f"{display} is not a regular file")
        if st.st_uid != os.getuid():
            raise KeyProblem(f"{display} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
        if st.st_mode & 0o077:
            raise KeyProblem(f"{display} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise KeyProblem(f"{display} holds {len(key)} bytes, not a {KEY_BYTES}-byte key")
    return key


def create_key(keys_fd: int, display: Path, name: str | None = None) -> bytes:
    """This user's key `name` in `keys_fd`, made now if there is none (durable before
    first use: a record MACed with a key that a crash lost would only be rebuilt, but never
    trusted wrongly). A directory this user cannot write is a KeyProblem."""
    name = name or str(os.getuid())
    key = read_key(keys_fd, display, name)
    if key is not None:
        return key
    tmp = f".{os.getuid()}-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=keys_fd)
    except PermissionError:
        st = os.fstat(keys_fd)
        raise KeyProblem(f"{Path(display).parent} is not writable by you (it belongs to uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):o})") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # Create-only: a concurrent build of this user may have made it first.
        os.link(tmp, name, src_dir_fd=keys_fd, dst_dir_fd=keys_fd, follow_symlinks=False)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp, dir_fd=keys_fd)
    try:
        os.fsync(keys_fd)
    except OSError:
        pass
    key = read_key(keys_fd, display, name)
    assert key is not None
    return key


def user_key_dir(explicit_only: bool = False) -> Path | None:
    """This user's own key directory, outside any cache: `$TPUBUILD_KEY_DIR`, else (unless
    `explicit_only`) `$XDG_CONFIG_HOME/tpubuild/keys` or `$HOME/.config/tpubuild/keys`;
    None when no variable names one (a user with neither HOME nor a passwd entry)."""
    explicit = os.environ.get(KEY_DIR_VARIABLE)
    if explicit:
        return Path(explicit)
    if explicit_only:
        return None
    config = os.environ.get("XDG_CONFIG_HOME")
    if config and os.path.isabs(config):
        return Path(config) / "tpubuild" / "keys"
    home = os.environ.get("HOME")
    if home and os.path.isabs(home):
        return Path(home) / ".config" / "tpubuild" / "keys"
    return None


def user_key(directory: Path, create: bool) -> bytes | None:
    """The key in this user's own key `directory` (made, mode 0700, when `create`): used
    only if the directory is this user's and no one else can write it."""
    if create:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise KeyProblem(f"{directory} is not a directory only you can write (uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):o})")
        display = Path(directory) / USER_KEY_FILE
        return create_key(dir_fd, display, USER_KEY_FILE) if create else read_key(dir_fd, display, USER_KEY_FILE)
    finally:
        os.close(dir_fd)


def _owner(dir_fd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "owner unknown"
    return f"it belongs to uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}"


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
