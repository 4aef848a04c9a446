"""Recipe fields that hold paths, and rebasing them from "relative to the file" to
"relative to the workspace root" (the form that is hashed and that stages receive)."""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path
from typing import Any, Iterator

_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's NAME_MAX and PATH_MAX (limits.h); most file systems

ANY = object()  # matches any key or index in a path pattern

# Each pattern is a JSON path into a recipe; ANY matches any mapping key or list index.
PATH_FIELDS = (
    ("extends",),
    ("model", "saved_model"),
    ("model", "export", "script"),
    ("model", "export", "deps", ANY),
    ("converter", "quantization_options", "representative_datasets", ANY, "tfrecord_file_path"),
    ("converter", "quantization_options", "representative_datasets", ANY, "npz"),
    ("converter", "quantization_options", "representative_datasets", ANY, "deps", ANY),
    ("verify", "representative_datasets", ANY, "tfrecord_file_path"),
)


def iter_paths(data: Any) -> Iterator[tuple[tuple, str]]:
    """(json path, value) of every string found at a path field."""
    for pattern in PATH_FIELDS:
        yield from _match(data, pattern, ())


def _match(node: Any, pattern: tuple, path: tuple) -> Iterator[tuple[tuple, str]]:
    if not pattern:
        if isinstance(node, str):
            yield path, node
        return
    head, rest = pattern[0], pattern[1:]
    if isinstance(node, dict):
        keys = list(node) if head is ANY else [head] if head in node else []
        for key in keys:
            yield from _match(node[key], rest, path + (key,))
    elif isinstance(node, list) and head is ANY:
        for index, item in enumerate(node):
            yield from _match(item, rest, path + (index,))


def rebase(data: Any, file_dir: Path, root: Path, written: dict[tuple, str] | None = None) -> None:
    """Rewrite every path field of `data` in place: file-relative -> root-relative POSIX.
    `written` (Marks.written) receives each value as the user wrote it, for messages."""
    for path, value in list(iter_paths(data)):
        target = _container(data, path)
        target[path[-1]] = to_root_relative(value, file_dir, root)
        if written is not None:
            written[path] = value


def to_root_relative(value: str, file_dir: Path, root: Path) -> str:
    absolute = os.path.normpath(os.path.join(file_dir, os.path.expanduser(value)))
    return Path(os.path.relpath(absolute, root)).as_posix()


def leaves_root(relative: str) -> bool:
    return relative == ".." or relative.startswith("../") or os.path.isabs(relative)


def boundary_problem(relative: str, root: Path) -> str | None:
    """Why the root-relative `relative` may not be used, else None: it must name a place
    inside the workspace once symlinks are resolved (a link inside the workspace to a
    model outside it is outside). Phrased to follow the quoted path."""
    if "\0" in relative:
        return "contains a null byte"
    if leaves_root(relative):
        return f"is outside the workspace ({root})"
    real = os.path.realpath(os.path.join(root, relative))
    if not within(real, root):
        return f"is outside the workspace ({root}) through a symlink: it leads to {real}"
    return None


def name_problem(absolute: str) -> str | None:
    """Why the OS would refuse `absolute` as a path whatever the disk holds (a null byte,
    a name or path too long for the file system), else None; for paths tpubuild creates."""
    if "\0" in absolute:
        return "contains a null byte"
    encoded = os.fsencode(absolute)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > _NAME_MAX or len(encoded) >= _PATH_MAX:
        return f"cannot be used: {os.strerror(errno.ENAMETOOLONG)}"
    return None


def within(real_path: str | Path, root: Path) -> bool:
    """Whether `real_path` (symlinks resolved) is `root` or below it."""
    real_root = _real(str(root))
    real_path = str(real_path)
    return real_path == real_root or real_path.startswith(real_root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=64)
def _real(path: str) -> str:
    # The workspace root, resolved once per process rather than for every path checked.
    return os.path.realpath(path)


def _container(data: Any, path: tuple) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data
