"""The no-op memo: a stat-only proof that a recipe is still up to date.

The full no-op check (engine/lockdoc.py up_to_date) loads and validates the recipe, hashes
its inputs through the stat cache, reads every stage record and the lock file. That is
exact but costs milliseconds per recipe; with 2,000 recipes it would dominate. So when
the full check finds a recipe up to date, the files it read are remembered here with
their stat (device, inode, size, mtime_ns, ctime_ns): the recipe and its `extends`
bases, the source model's files and directories, declared and discovered inputs, the
stage records, the newest published version and the lock file. The next build accepts
the recipe as up to date without reading anything only if every one of them has the
same stat, and if the code, toolchain, environment allow-list, workspace file and the
set of recipe files are the same (the guard).

Soundness: an entry is written only if every file's ctime is older than the start of the
build that checked it (minus a margin for coarse file system clocks), so the content
the full check read is the content whose stat is remembered; a file changed since then
changes its ctime. Recipes whose inputs are globs are never memoized (a new matching
file in a subdirectory would not change any remembered stat).

Cost (issue 48: 2,000 recipes in about a quarter of a second). The file has three parts.
The first line, a small JSON header, holds the guard, the digests and sizes of two path
lists, and the stat of every directory whose listing decides the set of recipe files
(each directory a `recipes:` glob lists or looks into): while they are the same, so is
the set, and no glob runs. Then come the two lists, every remembered path once (relative
to the workspace root where it is below it), as file-system bytes each ended by a NUL
(no JSON to parse, no text to encode back for the stat): the files that decide the lock
files (recipes, lock files, inputs; what `build --check` needs, as lock/quickcheck.py
proves from hashes) and those that only the build's outputs are (published versions,
stage records: what `build` needs besides). A no-op reads only these. The last line, each
recipe's own entry (its rows, version and files with their stats), is parsed only to
print rows (-v, --json), to pick recipes by name, or by the full path to remember more.
Directories are remembered under the same rule as files (their ctime older than the
build), or not at all: then the no-op globs the recipes as before.

A no-op's cost is the stats: about 21 a recipe (the recipe, its lock file, the model's
files and directories, the published version's, a stage record), each a different
inode, each deciding an output. So nothing else is done per path in Python: the stats
run as one chain of C calls (`os.stat`, the five fields, packed as 64-bit integers) a
piece of the list at a time into one hasher, from the workspace root as working
directory (a `dir_fd` keyword through functools.partial costs a quarter of a stat).
Measured here (issue 48), a bare `os.stat` is ~2.2 us, the chain's own work ~0.3 us
more: what is left per recipe is the kernel's path walk and CPython's stat_result. With
a second CPU, `build` checks its two lists at once, the outputs' in a forked child
(_lists_hold): 2,000 recipes' no-op went from 0.16 s to 0.12 s here.
"""

from __future__ import annotations

import fnmatch
import json
import os
import struct
import sys
from collections import deque
from itertools import starmap
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from tpubuild.atomic import write_atomic
from tpubuild.digests import hash_bytes, key_env, toolchain
from tpubuild.keys import PACKAGE_ROOT, canonical_dumps, package_fingerprint

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from tpubuild.config.workspace import Workspace

SCHEMA = 3
MARGIN_NS = 2_000_000_000  # coarse timestamps: ext4 ctime ticks with the kernel's jiffies, FAT/SMB with seconds
MEMO_FILE = "noop-memo"
# The memo of schema 2, in JSON: nothing reads it since; the next save removes it (up to 9 MB at 2,000 recipes).
OLD_MEMO_FILE = "noop-memo.json"
SEP = b"\0"  # ends each path in the lists: the one byte no path holds

_FIELDS = attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
# dev, ino, size as the kernel's unsigned 64 bits, the times signed (before 1970);
# struct.error past 2262, which sends the command down the full path. Native order
# ("@"): the memo never leaves its machine, and the standard sizes ("<") convert each
# integer byte by byte, a tenth of the chain's Python time.
_PACK = struct.Struct("@3Q2q").pack


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return list(_FIELDS(st))  # the fields the no-op's stats digest: remembered and checked alike


def guard(ws: Workspace | _Seen) -> str:
    """What every memo entry depends on besides its own files (the set of recipe files is
    checked beside it: by directory stats, or by globbing)."""
    return hash_bytes(canonical_dumps({
        "schema": SCHEMA,
        "code": package_fingerprint(),
        "toolchain": toolchain(),
        "env": key_env(),
        "workspace": _stat(str(ws.file)),
        "output_dir": str(ws.output_dir),
        "cache_dir": str(ws.cache_dir),
    }).encode())


def stats_digest(paths: bytes) -> str | None:
    """One digest of the stat (device, inode, size, mtime_ns, ctime_ns) of every path of a
    memo's list (`paths`: each ended by SEP), in order, relative ones below the working
    directory; None when one cannot be stat'ed. The stats are the whole cost of a large
    no-op (21 a recipe): nothing else is done per path, and no Python object outlives
    its stat. (Two threads, as Bazel checks files in parallel, measured no faster here:
    the GIL.)"""
    try:
        return _digest(map(_FIELDS, map(os.stat, chunk)) for chunk in _chunks(paths))
    except (OSError, ValueError, struct.error):
        return None


PARALLEL_MIN_PATHS = 1024  # a second list shorter than this is checked here: the fork would cost what it saves


def _lists_hold(lists: list[tuple[bytes, str | None]]) -> bool:
    """Whether each list's stats digest is the one remembered. With a second CPU free and a
    second list long enough to pay for a fork (~0.6 ms here, the cost of ~270 stats), a
    forked child checks the second list while this process checks the first: the stats are
    independent, and one process's stats are bound by the GIL (threads measured no faster),
    as git's preload-index and Bazel check files on every core. The child answers one byte
    and ends with os._exit (nothing of this process's is flushed or run twice); a child that
    dies or cannot be forked is a "no" or the one-process check: never a wrong "yes"."""
    if len(lists) == 2 and lists[1][0].count(SEP) >= PARALLEL_MIN_PATHS and _fork_is_safe():
        return _hold_in_two(lists[0], lists[1])
    return _hold_here(lists)


def _hold_here(lists: Iterable[tuple[bytes, str | None]]) -> bool:
    """The one-process check: each list's stats digest, in turn."""
    return all(stats_digest(blob) == digest for blob, digest in lists)


def _fork_is_safe() -> bool:
    """Two CPUs for this process, and no other thread (a fork copies only the calling
    thread: a lock another held would stay held in the child)."""
    if not hasattr(os, "fork") or len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2:
        return False
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _hold_in_two(first: tuple[bytes, str | None], second: tuple[bytes, str | None]) -> bool:
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return _hold_here((first, second))
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return _hold_here((first, second))
    if pid == 0:  # the child: one byte, then gone, whatever happens
        try:
            os.close(read_end)
            os.write(write_end, b"1" if stats_digest(second[0]) == second[1] else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        same = stats_digest(first[0]) == first[1]
        if not same:  # the full path decides: the child's answer is not needed
            import signal

            os.kill(pid, signal.SIGKILL)
        return same and os.read(read_end, 1) == b"1"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def _chunks(paths: bytes, size: int = 1 << 16) -> Iterator[list[bytes]]:
    """The paths of a list, a few thousand at a time: the memory of one piece is the
    next's (all 42,000 paths of 2,000 recipes at once are 3 MB of new pages, each page
    touched first costing as much as a stat)."""
    start, end = 0, len(paths)
    while start < end:
        stop = paths.find(SEP, start + size)
        stop = end - 1 if stop < 0 else stop
        yield paths[start:stop].split(SEP)
        start = stop + 1


def _digest(pieces: Iterable[Iterable[Sequence[int]]]) -> str:
    """The digest of stats, each (dev, ino, size, mtime_ns, ctime_ns), packed as 64-bit
    integers: what the no-op computes from os.stat and the memo from the stats it
    remembered (lists read back from JSON), byte for byte, however they are cut in
    pieces. Each packed stat is appended as it is made (deque(maxlen=0) runs the chain
    in C), a piece's buffer hashed and let go."""
    hasher = blake3.blake3()
    for stats in pieces:
        packed = bytearray()
        deque(map(packed.extend, starmap(_PACK, stats)), maxlen=0)
        hasher.update(packed)
    return hasher.hexdigest()


class NoopMemo:
    def __init__(self, ws: Workspace, recipe_files: list[Path]):
        self.path = Path(ws.state_dir) / MEMO_FILE
        self.guard = guard(ws)
        self.recipe_files = [str(p) for p in recipe_files]
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self.since_ns: int | None = None
        try:
            data = self.path.read_bytes()
            line, _, rest = data.partition(b"\n")
            head = json.loads(line)
            if head.get("guard") == self.guard:
                self.entries = json.loads(rest[sum(head.get("paths", ())):])
        except (OSError, ValueError, AttributeError, TypeError):
            return

    def check(self, recipe_file: Path) -> dict[str, Any] | None:
        """The remembered result (name, rows, version) when every file is unchanged."""
        entry = self.entries.get(str(recipe_file))
        if entry is None:
            return None
        for path, stat in entry["files"]:
            if _stat(path) != stat:
                return None
        return entry

    def remember(self, recipe_file: Path, name: str, rows: list[list[str]], version: int | None,
                 files: list[str], since_ns: int) -> bool:
        """Remember a recipe found up to date by the full check that began at `since_ns`."""
        self.since_ns = since_ns if self.since_ns is None else min(self.since_ns, since_ns)
        stats = []
        for path in sorted(set(files)):
            stat = _stat(path)
            if stat is None or stat[4] >= since_ns - MARGIN_NS:
                self.forget(recipe_file)
                return False
            stats.append([path, stat])
        self.entries[str(recipe_file)] = {"name": name, "rows": rows, "version": version, "files": stats}
        self.dirty = True
        return True

    def forget(self, recipe_file: Path) -> None:
        if self.entries.pop(str(recipe_file), None) is not None:
            self.dirty = True

    def save(self, ws: Workspace) -> None:
        if not self.dirty:
            return
        root = Path(ws.root).resolve()
        seen = {"file": str(Path(ws.file).resolve()), "stat": _stat(str(ws.file)), "recipes": list(ws.recipe_globs),
                "output_dir": str(ws.output_dir), "cache_dir": str(ws.cache_dir)}
        head: dict[str, Any] = {"schema": SCHEMA, "guard": self.guard, "workspace": seen, "complete": False}
        lists: list[bytes] = []
        summary = _summary(self.entries, self.recipe_files, root, ws)
        if summary is not None and self.since_ns is not None \
                and _settled([str(ws.file)], self.since_ns) and _settled(_code_files(), self.since_ns):
            fields, lists = summary
            head.update(fields, complete=True, paths=[len(b) for b in lists],
                        dirs=_listing_dirs(root, list(ws.recipe_globs), self.since_ns))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, b"".join([json.dumps(head).encode(), b"\n", *lists,
                                               json.dumps(self.entries).encode(), b"\n"]))
            (self.path.parent / OLD_MEMO_FILE).unlink(missing_ok=True)
        except OSError:
            pass  # only a memo: the next build does the full check


def _summary(entries: dict[str, dict[str, Any]], recipe_files: list[str], root: Path,
             ws: Workspace) -> tuple[dict[str, Any], list[bytes]] | None:
    """The header's proof for exactly `recipe_files` and the two path lists it is about:
    every remembered path once, inputs and outputs apart, each list's digest of the stats
    remembered; None when a recipe has no entry, two entries remember one path with
    different stats (one of them is out of date: the full path decides), or a stat does
    not pack."""
    remembered: dict[str, list[int]] = {}
    for recipe_file in recipe_files:
        entry = entries.get(recipe_file)
        if entry is None:
            return None
        for path, stat in entry["files"]:
            if remembered.setdefault(path, stat) != stat:
                return None
    owned = tuple(os.path.join(os.path.normpath(os.path.abspath(d)), "") for d in (ws.output_dir, ws.cache_dir))
    prefix = os.path.join(str(root), "")
    inputs: list[tuple[str, list[int]]] = []
    outputs: list[tuple[str, list[int]]] = []
    for path, stat in sorted(remembered.items()):
        short = path.removeprefix(prefix)
        (outputs if os.path.normpath(path).startswith(owned) else inputs).append((short, stat))

    try:
        digests = [_digest([[stat for _, stat in pairs]]) for pairs in (inputs, outputs)]
    except struct.error:
        return None
    fields = {"root": str(root), "recipe_files": [p.removeprefix(prefix) for p in recipe_files],
              "rows": sum(len(entries[f]["rows"]) for f in recipe_files),
              "inputs_digest": digests[0], "outputs_digest": digests[1]}
    return fields, [b"".join(os.fsencode(p) + SEP for p, _ in pairs) for pairs in (inputs, outputs)]


def _code_files() -> list[str]:
    """Every file of tpubuild's package (package_fingerprint's are among them)."""
    return [os.path.join(d, n) for d, _, names in os.walk(PACKAGE_ROOT) for n in names]


def _settled(paths: list[str], since_ns: int) -> bool:
    """Whether every path exists and last changed MARGIN_NS before `since_ns` (racy git's
    rule: a file changed within a timestamp's granularity of the stat that remembers it
    could change again without changing its stat). The guard remembers the workspace
    file's stat and the code's: a build that began just after an edit remembers nothing."""
    return all(_settled_stat(path, since_ns) is not None for path in paths)


def _settled_stat(path: str, since_ns: int) -> list[int] | None:
    """The stat of `path` when it exists and is settled (`_settled`'s rule), else None."""
    stat = _stat(path)
    return None if stat is None or stat[4] >= since_ns - MARGIN_NS else stat


def _listing_dirs(root: Path, patterns: list[str], since_ns: int | None) -> list[list[Any]] | None:
    """[path, stat] of every directory whose listing the globs `patterns` read, as this
    memo's entries were checked (each older than `since_ns` by MARGIN_NS); None when a
    pattern has `**` or a directory changed too recently: the no-op then globs."""
    if since_ns is None:
        return None
    found: dict[str, list[int]] = {}
    for pattern in patterns:
        if "**" in pattern or os.path.isabs(pattern):
            return None
        parts = [p for p in pattern.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            return None
        level = [str(root)]
        for i, part in enumerate(parts):
            following = []
            for directory in level:
                stat = _settled_stat(directory, since_ns)
                if stat is None:
                    return None
                found[directory] = stat
                if i == len(parts) - 1:
                    continue
                if any(c in part for c in "*?["):  # listed (hidden names too: more directories, never fewer)
                    try:
                        names = os.listdir(directory)
                    except OSError:
                        return None
                    following += [os.path.join(directory, n) for n in sorted(fnmatch.filter(names, part))
                                  if os.path.isdir(os.path.join(directory, n))]
                elif os.path.isdir(os.path.join(directory, part)):
                    following.append(os.path.join(directory, part))
            level = following
    return [[path, stat] for path, stat in sorted(found.items())]


def _same_dirs(dirs: list[list[Any]]) -> bool:
    return all(_stat(path) == stat for path, stat in dirs)


def quick(start: Path, override: Path | None, outputs: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """(workspace root, the memo's header) when the whole workspace is provably up to
    date from stats alone: its lock files (the inputs' stats), and with `outputs` its
    published versions and stage records too; None sends the command down the full path."""
    from tpubuild.config.finding import STATE_DIR, discover_files, workspace_file_for

    ws_file = workspace_file_for(start, override)
    if ws_file is None:
        return None
    root = ws_file.parent.resolve()
    try:
        with open(root / STATE_DIR / MEMO_FILE, "rb") as f:
            head = json.loads(f.readline())
            if not isinstance(head, dict) or head.get("schema") != SCHEMA or not head.get("complete"):
                return None
            sizes = head["paths"]
            lists = [f.read(sizes[0])] + ([f.read(sizes[1])] if outputs else [])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if head.get("root") != str(root) or [len(b) for b in lists] != sizes[:len(lists)]:
        return None
    seen = head.get("workspace") or {}
    if seen.get("file") != str(ws_file.resolve()) or seen.get("stat") != _stat(str(ws_file)):
        return None
    if head.get("guard") != guard(_Seen(ws_file.resolve(), seen)):
        return None
    dirs = head.get("dirs")
    if dirs is None or not _same_dirs(dirs):  # the set of recipe files, found by globbing
        prefix = os.path.join(str(root), "")
        files = [str(p) for p in discover_files(root, seen.get("recipes", []), ws_file)]
        if [p.removeprefix(prefix) for p in files] != head.get("recipe_files"):
            return None
    # The stats run from the root as working directory (see the module's docstring), put
    # back after them; only the executable's fast paths and the CLI's, single-threaded,
    # call this: no other thread sees the change.
    try:
        back = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    except OSError:  # a working directory one may not open: the full path decides
        return None
    try:
        os.chdir(root)
        if not _lists_hold(list(zip(lists, (head.get("inputs_digest"), head.get("outputs_digest"))))):
            return None
    except OSError:
        return None
    finally:
        try:
            os.fchdir(back)
        finally:
            os.close(back)
    return root, head


def memo_entries(root: Path, head: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each recipe's remembered entry (name, rows, version), in recipe-file order, from the
    memo's last line (what quick proved with its header); None when it cannot be read."""
    from tpubuild.config.finding import STATE_DIR

    try:
        with open(root / STATE_DIR / MEMO_FILE, "rb") as f:
            if json.loads(f.readline()) != head:
                return None
            f.seek(sum(head["paths"]), os.SEEK_CUR)
            recipes = json.loads(f.read())
        return [recipes[p if os.path.isabs(p) else str(root / p)] for p in head["recipe_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Seen:
    """The workspace fields the guard reads, as the memo remembered them."""

    def __init__(self, file: Path, seen: dict[str, Any]):
        self.file = file
        self.output_dir = seen["output_dir"]
        self.cache_dir = seen["cache_dir"]
