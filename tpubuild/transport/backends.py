"""The transport under the remote cache (remote/cache.py) and the versions `publish_to:`
publishes (publish/destination.py): bytes under names, in an object store through fsspec
(s3://, gs://) or a shared directory (file://). It knows no stage keys, records or store
layout: each user roots it where its own layout starts (`<url>/v1/` for the cache,
`<url>/` for a publish destination) and says how many bytes a read may take.

Both give the writes the two need: an upload that is atomic under its final name (whole
or absent, never a part), a create-only write that fails, without changing anything,
when the name exists, and a copy within the store (server-side on S3 and GCS). A
directory also renames a whole tree at once (`rename_tree`), which an object store
cannot: there a tree appears object by object, in the order its writer chose.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from builtins import list as List  # noqa: UP035 - `list` is a method name of the backends below
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tpubuild import progress
from tpubuild.config.remote_url import BACKENDS, EXTRA, Timeouts, url_problem
from tpubuild.digests import CHUNK
from tpubuild.errors import TpubuildError

# A download is read in requests of CHUNK bytes (S3/GCS range reads; the size tpubuild reads
# a file in, digests/hashing.py), each under the total deadline: a trickling server is cut
# off, and no more than the size the caller expects is ever read (a replaced 200 MiB object
# costs a HEAD, not 200 MiB).


class NotARegularFile(FileNotFoundError):
    """An answer like FileNotFoundError (nothing usable under that name), from a file://
    remote: the name is a FIFO, a device, a socket, a directory or a link, refused without
    being opened (a FIFO blocks an open until a writer comes; a device may never end).
    `kind` says what it is, for the caller's report."""

    def __init__(self, path: str, kind: str):
        super().__init__(errno.ENOENT, f"{kind}, not a regular file; not opened", path)
        self.kind = kind


class ObjectTooLarge(Exception):
    """An answer, like FileNotFoundError: the object holds more bytes than may be read."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size} bytes, more than the {limit} expected")
        self.size, self.limit = size, limit


class RemoteTimeout(TimeoutError):
    """A call got no (complete) answer within its deadline."""


class RemoteSetupError(TpubuildError):
    """The remote cannot be used at all on this machine (a backend is not installed)."""

    exit_code = 1


class Backend:
    """Paths are relative to the backend's root (`<url>/v1/` for the remote cache).
    `read`, `download` and `size` raise FileNotFoundError for an absent name, and `read`
    and `download` ObjectTooLarge for one of more than `limit` bytes, having read none of
    them; `download` returns the bytes it wrote; `upload` replaces a name atomically;
    `create` writes a new name and returns False, changing nothing, when it exists;
    `list` gives (relative path, size, modification time) of the files below a prefix
    (within `deadline` seconds when given, else the total timeout); `copy` makes `dst`
    a whole copy of `src` (FileNotFoundError when `src` is absent); `rename_tree` moves
    the tree below one prefix to another at once and says True, or says False, doing
    nothing, where the store cannot (an object store); `remove_tree` deletes every file
    below a prefix, the names in `first` before the others."""

    def read(self, rel: str, limit: int) -> bytes:
        raise NotImplementedError

    def download(self, rel: str, local: str, limit: int) -> int:
        raise NotImplementedError

    def size(self, rel: str) -> int:
        raise NotImplementedError

    def upload(self, local: str, rel: str) -> None:
        raise NotImplementedError

    def create(self, rel: str, data: bytes) -> bool:
        raise NotImplementedError

    def list(self, rel_prefix: str, deadline: float | None = None) -> List[tuple[str, int, float]]:
        raise NotImplementedError

    def delete(self, rels: List[str]) -> None:
        raise NotImplementedError

    def copy(self, src: str, dst: str) -> None:
        raise NotImplementedError


    def rename_tree(self, src: str, dst: str) -> bool:
        return False

    def temps(self, rel_prefix: str) -> List[tuple[str, int, float]]:
        """Temp files below a prefix that `list` leaves out (a directory's writes in
        progress, or of killed writers); an object store writes none."""
        return []

    def remove_tree(self, prefix: str, first: tuple[str, ...] = ()) -> None:
        below = prefix.rstrip("/") + "/"
        names = [rel for rel, _size, _mtime in self.list(below) if rel.startswith(below)]
        early = [rel for rel in names if rel in first]
        self.delete(early)
        self.delete([rel for rel in names if rel not in first])


def open_backend(url: str, timeouts: Timeouts | None = None, layout: str = "",
                 what: str = "remote cache") -> Backend:
    """The backend of `url`, rooted at `<url>/<layout>/` (the remote cache's `v1`; a
    publish destination's root is the URL itself: layout ""). `what` names the setting in
    messages."""
    problem = url_problem(url)
    if problem:
        raise TpubuildError(f"{what}: {problem}")
    scheme = urlsplit(url).scheme
    if scheme == "file":
        # A mount is a local directory: the base install reads and writes it with os alone
        # (url_problem has made sure the path is absolute, plain and normalized).
        root = Path(urlsplit(url).path.rstrip("/") or "/")
        return _LocalBackend(root / layout if layout else root)
    try:
        import fsspec
    except ImportError:
        raise RemoteSetupError(f"{what} {url}: fsspec is not installed (pip install '{EXTRA}')") from None
    package = BACKENDS[scheme]
    if package is not None:
        try:
            __import__(package)
        except ImportError:
            raise RemoteSetupError(
                f"{what} {url}: the {scheme}:// backend needs {package} (pip install '{EXTRA}')") from None
    timeouts = timeouts or Timeouts()
    options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    if package == "s3fs":
        # Few retries (botocore's and s3fs's own, which are outside botocore's): with
        # their defaults an endpoint that never answers held a build ~930 s. The total
        # deadline of each call (_FsspecBackend) bounds them whatever they are.
        options["config_kwargs"] = {"connect_timeout": timeouts.connect, "read_timeout": timeouts.first_byte,
                                    "retries": {"max_attempts": 2, "mode": "standard"}}
    elif package == "gcsfs":
        options["requests_timeout"] = timeouts.first_byte
    _daemon_resolver_threads()
    fs, root = fsspec.core.url_to_fs(url, **options)
    if package == "s3fs":
        fs.retries = 2  # a class attribute of S3FileSystem (5), not a constructor argument
    root = root.rstrip("/")
    return _FsspecBackend(fs, f"{root}/{layout}" if layout else root, timeouts)


class _DaemonThreads(ThreadPoolExecutor):
    """The default executor of fsspec's event loop: each call in a daemon thread of its own.

    aiohttp (under s3fs's aiobotocore, and gcsfs) resolves host names with its
    ThreadedResolver, i.e. `loop.getaddrinfo`, which runs `socket.getaddrinfo` in the
    loop's default executor (aiohttp/resolver.py; asyncio/base_events.py `getaddrinfo` ->
    `run_in_executor(None, ...)`). That default is a ThreadPoolExecutor, whose worker
    threads the interpreter joins at exit (concurrent/futures/thread.py `_python_exit`):
    with a DNS server that never answers, the call's deadline fired (fsspec's `timeout=`
    cancels the await), but the process then waited at exit for glibc's whole resolver
    timeout (`timeout` x `attempts` per name server and query, 120 s seen). A daemon
    thread is not joined: the process exits when the build is done, and the stuck
    getaddrinfo ends with it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)  # asyncio accepts a ThreadPoolExecutor only; none of its workers starts

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as the pool does
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="tpubuild-remote-resolver", daemon=True).start()
        return future


_daemon_loops: set[int] = set()


def _daemon_resolver_threads() -> None:
    """Give fsspec's event loop (one per process, in a daemon thread) `_DaemonThreads` as
    its default executor, before its first call needs one."""
    from fsspec.asyn import get_loop

    loop = get_loop()
    if id(loop) not in _daemon_loops:
        _daemon_loops.add(id(loop))
        loop.call_soon_threadsafe(loop.set_default_executor, _DaemonThreads())


class _FsspecBackend(Backend):
    """Object stores through fsspec. Create-only is the server's own conditional write,
    never a check-then-put (two racers would both pass the check): s3fs sends
    `pipe_file(mode="create")` as S3's `If-None-Match: *` and raises FileExistsError on
    the 412 (s3fs/core.py `_pipe_file`; moto's server honours it, which
    tests/remote/test_remote_cache.py's race checks), gcsfs as `ifGenerationMatch=0`
    (gcsfs/core.py `_pipe_file`, its 412 -> FileExistsError in gcsfs/retry.py). A server
    that ignores the condition degrades to last writer wins; hence the trust model:
    only trusted builders push (README). An object store's PUT (or multipart upload)
    is atomic: an object appears whole or not at all, so no temp name is needed.

    Every call goes through `_call`, under a deadline: fsspec's `timeout=` (fsspec/asyn.py
    `sync`) wraps the call, its retries included, in `asyncio.wait_for`, which cancels it."""

    def __init__(self, fs: Any, root: str, timeouts: Timeouts):
        self.fs, self.root, self.timeouts = fs, root, timeouts

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _call(self, method: str, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        from fsspec.exceptions import FSTimeoutError

        deadline = deadline or self.timeouts.total
        try:
            return getattr(self.fs, method)(*args, timeout=deadline, **kwargs)
        except FSTimeoutError:
            raise RemoteTimeout(f"no complete answer within {deadline:g} s (remote_cache: total_timeout)") from None

    def read(self, rel: str, limit: int) -> bytes:
        size = self.size(rel)
        if size > limit:
            raise ObjectTooLarge(size, limit)
        # A range read of the size just seen: an object replaced meanwhile by a larger
        # one is still read only this far (and then fails its checks).
        return self._call("cat_file", self._path(rel), start=0, end=size) if size else b""

    def download(self, rel: str, local: str, limit: int) -> int:
        size = self.size(rel)
        if size > limit:
            raise ObjectTooLarge(size, limit)
        done = 0
        with open(local, "wb") as out:
            while done < size:
                data = self._call("cat_file", self._path(rel), start=done, end=min(size, done + CHUNK))
                if not data:
                    break  # shorter than it said: the hash check says so
                out.write(data)
                done += len(data)
                progress.advance(len(data))
        return done

    def size(self, rel: str) -> int:
        return int(self._call("info", self._path(rel))["size"])

    def upload(self, local: str, rel: str) -> None:
        extra = {}
        if progress.current() is not None:  # a terminal shows the bytes sent (fsspec's callbacks)
            extra["callback"] = _counted_callback()
        self._call("put_file", local, self._path(rel), deadline=self.timeouts.upload_deadline(os.path.getsize(local)),
                   **extra)

    def create(self, rel: str, data: bytes) -> bool:
        try:
            self._call("pipe_file", self._path(rel), data, mode="create")
        except FileExistsError:
            return False
        return True

    def list(self, rel_prefix: str, deadline: float | None = None) -> List[tuple[str, int, float]]:
        try:
            found = self._call("find", self._path(rel_prefix), detail=True, deadline=deadline)
        except FileNotFoundError:
            return []
        out = []
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = name[len(self.root) + 1:] if name.startswith(self.root + "/") else None
            if rel is None:
                continue
            out.append((rel, int(info.get("size") or 0), _mtime(info)))
        return out

    def delete(self, rels: List[str]) -> None:
        for start in range(0, len(rels), 500):
            self._call("rm", [self._path(r) for r in rels[start:start + 500]])

    def copy(self, src: str, dst: str) -> None:
        # The store copies (S3 CopyObject, a multipart copy past 5 GiB: s3fs/core.py
        # `_cp_file`; GCS's rewrite: gcsfs/core.py `_cp_file`): no byte passes through here,
        # and the copy appears whole under `dst`, like a PUT.
        size = self.size(src)
        self._call("cp_file", self._path(src), self._path(dst), deadline=self.timeouts.upload_deadline(size))


def _mtime(info: dict[str, Any]) -> float:
    for name in ("LastModified", "mtime", "updated", "created"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        try:
            from datetime import datetime

            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return 0.0


class _LocalBackend(Backend):
    """A directory (a shared mount). Objects: a dot-named temp file in the target
    directory, fsynced, renamed over the name (whole or absent; a reader never sees a
    part). Records: the same temp file hard-linked to the name, which fails when the name
    exists (create-only, like O_EXCL, but never a visible half-written record).

    Anyone who can write the directory can put a FIFO, a device or a link where a record
    or an object should be, or a link where a directory should be: every component below
    the root is opened without following a link, and every change made by descriptor
    (transport/mount.py). A name is read only if it is a regular file, opened without
    blocking (NotARegularFile otherwise: a miss the caller reports, never a hang); a name
    reached through a link is absent to a read or a removal, and refused to a write."""

    def __init__(self, root: Path):
        self.root = root
        self.left: list[str] = []  # what removals could not remove, a line each (the caller says them)

    def _open(self, rel: str) -> Any:
        from tpubuild.fs import NotAFile, open_regular_at
        from tpubuild.transport.mount import LinkInPath, parent

        try:
            with parent(self.root, rel) as (fd, name):
                try:
                    handle, _st = open_regular_at(name, fd)
                except NotAFile as exc:
                    raise NotARegularFile(os.fspath(self.root / rel), exc.kind) from None
        except (LinkInPath, NotADirectoryError) as exc:
            raise NotARegularFile(os.fspath(self.root / rel), getattr(exc, "kind", "not a directory")) from None
        return os.fdopen(handle, "rb")

    def read(self, rel: str, limit: int) -> bytes:
        with self._open(rel) as src:
            size = os.fstat(src.fileno()).st_size
            if size > limit:
                raise ObjectTooLarge(size, limit)
            return src.read(limit)

    def download(self, rel: str, local: str, limit: int) -> int:
        with self._open(rel) as src, open(local, "wb") as out:
            size = os.fstat(src.fileno()).st_size
            if size > limit:
                raise ObjectTooLarge(size, limit)
            done = 0
            while done < limit and (data := src.read(min(CHUNK, limit - done))):
                out.write(data)
                done += len(data)
                progress.advance(len(data))
        return done

    def size(self, rel: str) -> int:
        with self._open(rel) as src:
            return os.fstat(src.fileno()).st_size

    def _write(self, rel: str, write: Callable[[Any], None], commit: Callable[[str, str, int], None],
               mode: int | None) -> None:
        """A dot-named temp file beside `rel` (its directories made, none through a link)
        holding what `write` writes, fsynced, then `commit(tmp, name, dir_fd)`; the temp
        file removed whatever happens."""
        from tpubuild.fs import fsync_fd
        from tpubuild.transport.mount import parent

        with parent(self.root, rel, create=True, notes=self.left) as (fd, name):
            tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                          dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as handle:
                    write(handle)
                    handle.flush()
                    if mode is not None:
                        os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
                commit(tmp, name, fd)
            finally:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
            fsync_fd(fd)

    def upload(self, local: str, rel: str) -> None:
        # os.replace replaces whatever is there (a link itself, a FIFO), never writes into it.
        self._write(rel, lambda out: _copy_into(local, out),
                    lambda tmp, name, fd: os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd), 0o444)

    def create(self, rel: str, data: bytes) -> bool:
        created = []

        def link(tmp: str, name: str, fd: int) -> None:
            try:
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                return
            created.append(name)

        self._write(rel, lambda out: out.write(data), link, None)
        return bool(created)

    def _walk(self, rel_prefix: str) -> Any:
        from tpubuild.transport.mount import walk

        return walk(self.root, rel_prefix, self.left)

    def list(self, rel_prefix: str, deadline: float | None = None) -> List[tuple[str, int, float]]:
        # Dot-named files are temp files of writes in progress (or of killed writers).
        return [(rel, st.st_size, st.st_mtime) for rel, kind, st in self._walk(rel_prefix)
                if kind == "file" and not rel.rsplit("/", 1)[-1].startswith(".")]

    def directories(self, rel_prefix: str) -> List[str]:
        """Every directory (an empty one too) or link below a prefix: names someone took."""
        return [rel for rel, kind, _st in self._walk(rel_prefix) if kind in ("dir", "link")]

    def delete(self, rels: List[str]) -> None:
        from tpubuild.transport.mount import LinkInPath, parent

        for rel in rels:
            try:
                with parent(self.root, rel) as (fd, name):
                    os.unlink(name, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError, LinkInPath):
                continue  # absent, or reached through a link: not in the destination

    def temps(self, rel_prefix: str) -> List[tuple[str, int, float]]:
        return [(rel, st.st_size, st.st_mtime) for rel, kind, st in self._walk(rel_prefix)
                if kind == "file" and (name := rel.rsplit("/", 1)[-1]).startswith(".") and name.endswith(".tmp")]

    def copy(self, src: str, dst: str) -> None:
        with self._open(src) as source:
            self._write(dst, lambda out: shutil.copyfileobj(source, out, 1 << 20),
                        lambda tmp, name, fd: os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd), 0o444)

    def rename_tree(self, src: str, dst: str) -> bool:
        """The directory `src` renamed to `dst` (which must not exist): every file of it
        appears under `dst` at one instant. FileNotFoundError when `src` is gone (another
        writer renamed it), FileExistsError when `dst` exists (an empty directory too)."""
        from contextlib import ExitStack

        from tpubuild.fs import fsync_fd, lstat_at
        from tpubuild.transport.mount import LinkInPath, parent

        with ExitStack() as stack:
            try:
                source_fd, source_name = stack.enter_context(parent(self.root, src))
            except (LinkInPath, NotADirectoryError):
                raise FileNotFoundError(errno.ENOENT, "not in the destination", src) from None
            target_fd, target_name = stack.enter_context(parent(self.root, dst, create=True, notes=self.left))
            if lstat_at(target_name, target_fd) is not None:
                raise FileExistsError(errno.EEXIST, "exists", os.fspath(self.root / dst))
            st = lstat_at(source_name, source_fd)
            if st is None or not stat.S_ISDIR(st.st_mode):
                raise FileNotFoundError(errno.ENOENT, "no such directory", os.fspath(self.root / src))
            # An empty directory made at `dst` since the check is replaced, as rename(2) does.
            os.rename(source_name, target_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
            fsync_fd(target_fd)
            fsync_fd(source_fd)
        return True

    def remove_tree(self, prefix: str, first: tuple[str, ...] = ()) -> None:
        """Renamed aside (a dot name beside it) first, then deleted by descriptor: the tree
        leaves its name at one instant, as `rename_tree` gave it. A prefix reached through a
        link is not in the destination: nothing is removed. What cannot be removed is left,
        a line each in `left`."""
        from tpubuild.fs import lstat_at
        from tpubuild.transport.mount import LinkInPath, parent, remove_below

        try:
            with parent(self.root, prefix) as (fd, name):
                st = lstat_at(name, fd)
                if st is None:
                    return
                if stat.S_ISDIR(st.st_mode):
                    trash = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.trash"
                    os.rename(name, trash, src_dir_fd=fd, dst_dir_fd=fd)
                    name = trash
                self.left += remove_below(fd, name, prefix.rstrip("/"))
        except (FileNotFoundError, NotADirectoryError, LinkInPath):
            return

    def stale_temps(self, older_than: float) -> List[str]:
        """Temp files of killed writers (dot-named, older than `older_than`, a timestamp)."""
        return [rel for rel, _size, mtime in self.temps("") if mtime < older_than]


def _copy_into(local: str, out: Any) -> None:
    with open(local, "rb") as src:
        while chunk := src.read(1 << 20):
            out.write(chunk)
            progress.advance(len(chunk))


def _counted_callback() -> Any:
    """An fsspec Callback that counts the bytes an upload reports into this thread's meter
    (s3fs and gcsfs call `relative_update` per part sent)."""
    from fsspec.callbacks import Callback

    meter = progress.current()  # fsspec calls back from its own event-loop thread

    class Counted(Callback):  # type: ignore[misc]
        def relative_update(self, inc: int = 1) -> None:
            if meter is not None:
                meter.add(inc)

    return Counted()

