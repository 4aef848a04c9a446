"""Where the remote cache's bytes live (remote/cache.py), and the versions `publish_to:`
publishes (publish/destination.py): an object store through fsspec (s3://, gs://) or a
shared directory (file://). Paths are relative to `<url>/v1/` for the cache, to `<url>/`
for a publish destination.

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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tpubuild.config.remote_url import BACKENDS, EXTRA, Timeouts, url_problem
from tpubuild.errors import TpubuildError, file_kind
from tpubuild.keys import RECORD_LIMIT
from tpubuild.store import LAYOUT

# A download is read in requests of this many bytes (S3/GCS range reads), each under
# the total deadline: a trickling server is cut off, and no more than the size the
# record states is ever read (a replaced 200 MiB object costs a HEAD, not 200 MiB).
CHUNK = 16 << 20


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

    def read(self, rel: str, limit: int = RECORD_LIMIT) -> bytes: ...
    def download(self, rel: str, local: str, limit: int) -> int: ...
    def size(self, rel: str) -> int: ...
    def upload(self, local: str, rel: str) -> None: ...
    def create(self, rel: str, data: bytes) -> bool: ...
    def list(self, rel_prefix: str, deadline: float | None = None) -> list[tuple[str, int, float]]: ...
    def delete(self, rels: list[str]) -> None: ...
    def copy(self, src: str, dst: str) -> None: ...

    def rename_tree(self, src: str, dst: str) -> bool:
        return False

    def temps(self, rel_prefix: str) -> list[tuple[str, int, float]]:
        """Temp files below a prefix that `list` leaves out (a directory's writes in
        progress, or of killed writers); an object store writes none."""
        return []

    def remove_tree(self, prefix: str, first: tuple[str, ...] = ()) -> None:
        below = prefix.rstrip("/") + "/"
        names = [rel for rel, _size, _mtime in self.list(below) if rel.startswith(below)]
        early = [rel for rel in names if rel in first]
        self.delete(early)
        self.delete([rel for rel in names if rel not in first])


def open_backend(url: str, timeouts: Timeouts | None = None, layout: str = LAYOUT,
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

    def read(self, rel: str, limit: int = RECORD_LIMIT) -> bytes:
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
        return done

    def size(self, rel: str) -> int:
        return int(self._call("info", self._path(rel))["size"])

    def upload(self, local: str, rel: str) -> None:
        self._call("put_file", local, self._path(rel), deadline=self.timeouts.upload_deadline(os.path.getsize(local)))

    def create(self, rel: str, data: bytes) -> bool:
        try:
            self._call("pipe_file", self._path(rel), data, mode="create")
        except FileExistsError:
            return False
        return True

    def list(self, rel_prefix: str, deadline: float | None = None) -> list[tuple[str, int, float]]:
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

    def delete(self, rels: list[str]) -> None:
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
    or an object should be: a name is read only if lstat says it is a regular file, and
    is then opened without following a link and without blocking (NotARegularFile
    otherwise: a miss the caller reports, never a hang)."""

    def __init__(self, root: Path):
        self.root = root

    def _open(self, rel: str) -> Any:
        path = self.root / rel
        st = os.lstat(path)  # FileNotFoundError: an answer
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(os.fspath(path), file_kind(st.st_mode))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):  # swapped between the lstat and the open
            os.close(fd)
            raise NotARegularFile(os.fspath(path), file_kind(found.st_mode))
        return os.fdopen(fd, "rb")

    def read(self, rel: str, limit: int = RECORD_LIMIT) -> bytes:
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
        return done

    def size(self, rel: str) -> int:
        path = self.root / rel
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(os.fspath(path), file_kind(st.st_mode))
        return st.st_size

    def _temp_copy(self, target: Path, write: Callable[[Any], None]) -> str:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        with open(tmp, "xb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        return os.fspath(tmp)

    def upload(self, local: str, rel: str) -> None:
        from tpubuild.atomic import fsync_path

        target = self.root / rel
        tmp = self._temp_copy(target, lambda out: _copy_into(local, out))
        try:
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)  # replaces whatever is there (a link itself, a FIFO), never writes into it
        finally:
            _unlink(tmp)
        fsync_path(target.parent)

    def create(self, rel: str, data: bytes) -> bool:
        from tpubuild.atomic import fsync_path

        target = self.root / rel
        tmp = self._temp_copy(target, lambda out: out.write(data))
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            _unlink(tmp)
        fsync_path(target.parent)
        return True

    def list(self, rel_prefix: str, deadline: float | None = None) -> list[tuple[str, int, float]]:
        out = []
        for dirpath, names in _walk(self.root / rel_prefix):
            for name in names:
                if name.startswith("."):
                    continue  # a temp file of a write in progress (or of a killed writer)
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append((Path(path).relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return out

    def delete(self, rels: list[str]) -> None:
        for rel in rels:
            _unlink(self.root / rel)

    def temps(self, rel_prefix: str) -> list[tuple[str, int, float]]:
        out = []
        for dirpath, names in _walk(self.root / rel_prefix):
            for name in names:
                if not (name.startswith(".") and name.endswith(".tmp")):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue  # its writer finished meanwhile
                if stat.S_ISREG(st.st_mode):
                    out.append((Path(path).relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return out

    def copy(self, src: str, dst: str) -> None:
        from tpubuild.atomic import fsync_path

        target = self.root / dst
        with self._open(src) as source:
            tmp = self._temp_copy(target, lambda out: shutil.copyfileobj(source, out, 1 << 20))
        try:
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        finally:
            _unlink(tmp)
        fsync_path(target.parent)

    def rename_tree(self, src: str, dst: str) -> bool:
        """The directory `src` renamed to `dst` (which must not exist): every file of it
        appears under `dst` at one instant. FileNotFoundError when `src` is gone (another
        writer renamed it), FileExistsError when `dst` exists."""
        from tpubuild.atomic import fsync_path

        source, target = self.root / src, self.root / dst
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "exists", os.fspath(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)  # an empty directory created at `target` meanwhile is replaced, as rename(2) does
        fsync_path(target.parent)
        fsync_path(source.parent)
        return True

    def remove_tree(self, prefix: str, first: tuple[str, ...] = ()) -> None:
        """Renamed aside (a dot name beside it) first, then deleted: the tree leaves its
        name at one instant, as `rename_tree` gave it."""
        path = self.root / prefix
        if not os.path.lexists(path):
            return
        if os.path.islink(path) or not path.is_dir():
            _unlink(path)
            return
        trash = path.parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.trash"
        os.rename(path, trash)
        from tpubuild.fs import remove_at

        parent = os.open(trash.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            remove_at(trash.name, parent)  # by descriptor, iteratively: any depth, no link followed
        finally:
            os.close(parent)

    def stale_temps(self, older_than: float) -> list[str]:
        """Temp files of killed writers (dot-named, older than `older_than`, a timestamp)."""
        found = []
        for dirpath, names in _walk(self.root):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    if name.startswith(".") and name.endswith(".tmp") and os.lstat(path).st_mtime < older_than:
                        found.append(Path(path).relative_to(self.root).as_posix())
                except FileNotFoundError:
                    continue
        return found


def _walk(top: Path | str) -> Any:
    """(directory path, names of what is not a directory in it) of `top` and every
    directory below it, as os.walk gives them but without recursion (Python 3.11's os.walk
    recurses: a directory 5000 deep, which anyone who can write the share can make, was a
    RecursionError) and never through a link; a directory that cannot be listed (its path
    too long, gone meanwhile) is skipped."""
    pending = [os.fspath(top)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        names = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                pending.append(entry.path)
            else:
                names.append(entry.name)
        yield directory, names


def _copy_into(local: str, out: Any) -> None:
    with open(local, "rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)


def _unlink(path: Any) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
