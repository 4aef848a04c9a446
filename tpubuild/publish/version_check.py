"""`tpubuild verify` of one version directory: every file its manifest lists, and nothing
else, without trusting a name or a size the directory holds.

A version may sit where others write (a group mount, a copy downloaded from a bucket), so
its manifest is data: a listed name is opened only when it is a clean relative path
(fs/names.py), each component without following a link (fs/nofollow.py), and only when
it is a regular file whose size is the one the manifest lists (`sizes`, written since
issue 46): a file larger than listed is refused before a byte of it is hashed (a listed
200 GiB sparse file costs an fstat, not minutes). A manifest without `sizes` (an older
tpubuild's) gets every regular file hashed, as before.

`identity_problems` checks that a version is the one its path names: the manifest's
`recipe`, `target` and `version` (and the provenance statement's, which the signature
covers) against `<recipe>/<N>` or `<recipe>/<target>/<N>`, so a signed version copied
under another number or recipe does not pass as that one.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.fs import (
    MAX_DEPTH,
    NotAFile,
    clean_relative,
    open_path,
    open_regular_at,
    opened,
    read_regular_at,
    version_number,
)
from tpubuild.provenance.statement import PROVENANCE, SIGNATURE
from tpubuild.publish.targets import MANIFEST

# The most a manifest, a provenance statement or a signature may hold: they list a
# version's files, a few KiB each hundred files.
DESCRIPTION_LIMIT = 64 << 20
OWN = frozenset({MANIFEST, PROVENANCE, SIGNATURE})


@dataclass
class Checked:
    """What `check_version` found: one line per problem; `refused`: some file was not
    hashed (not a regular file, another size than listed, a name that is not clean), so a
    signature check, which would hash it, is not run either."""

    problems: list[str] = field(default_factory=list)
    refused: bool = False
    manifest: dict[str, Any] | None = None


def read_description(root_fd: int, name: str) -> dict[str, Any] | None:
    """A JSON document of the version (its manifest, its statement), read without
    following a link and no larger than DESCRIPTION_LIMIT; None when absent or not a JSON
    object."""
    try:
        data = json.loads(read_regular_at(name, root_fd, DESCRIPTION_LIMIT))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_version(version_dir: Path, withheld: frozenset[str] | set[str] = frozenset()) -> Checked:
    """Problems of one version directory (a main or a target version) against its own
    manifest: a file whose content or size differs, a file missing, a file, link or
    special file the manifest does not list, a listed name that is not a clean relative
    path. Read-only. `withheld`: listed names the caller already reported (verify URL
    did not download them), not said again as missing."""
    found = Checked()
    try:
        root_fd = os.open(version_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        found.problems.append(f"cannot open it: {exc.strerror}")
        return found
    with opened(root_fd):
        manifest = read_description(root_fd, MANIFEST)
        if manifest is None or not isinstance(manifest.get("files"), dict):
            found.problems.append(f"{MANIFEST}: missing or unreadable (not a version tpubuild published)")
            return found
        found.manifest = manifest
        listed_sizes = manifest.get("sizes")
        sizes: dict[str, Any] = listed_sizes if isinstance(listed_sizes, dict) else {}
        listed = set()
        for rel, digest in sorted(manifest["files"].items()):
            name = clean_relative(rel)
            if name is None or name in OWN or not isinstance(digest, str):
                found.problems.append(f"{rel!r}: listed under a name that is not a clean relative path; not opened")
                found.refused = True
                continue
            listed.add(name)
            if name in withheld:
                found.refused = True
                continue
            problem = _check_file(root_fd, name, digest, sizes.get(name))
            if problem is not None:
                found.problems.append(problem)
                found.refused = found.refused or not problem.endswith(("content differs from the manifest", ": missing"))
        found.problems += [f"{rel}: not in the manifest" for rel in _unlisted(root_fd, listed | OWN)]
    return found


def _check_file(root_fd: int, name: str, digest: str, size: Any) -> str | None:
    """The problem of one listed file, or None: opened by descriptor, each component
    without following a link; its size compared before it is hashed."""
    from tpubuild.digests import hash_fd

    parent, base = os.path.split(name)
    try:
        parent_fd = open_path(root_fd, parent)
    except FileNotFoundError:
        return f"{name}: missing"
    except NotAFile as exc:  # a link or a file where a directory of the version should be
        return f"{name}: missing ({parent} is {exc.kind}; not followed)"
    except OSError as exc:
        return f"{name}: cannot read it ({exc.strerror})"
    try:
        with opened(parent_fd):
            fd, st = open_regular_at(base, parent_fd)
    except FileNotFoundError:
        return f"{name}: missing"
    except NotAFile as exc:
        return f"{name}: {exc.kind}, not a regular file; not read"
    except OSError as exc:
        return f"{name}: cannot read it ({exc.strerror})"
    with opened(fd):
        if isinstance(size, int) and not isinstance(size, bool):
            if st.st_size > size:
                return f"{name}: {st.st_size} bytes, more than the {size} its manifest lists; not hashed"
            if st.st_size != size:
                return f"{name}: {st.st_size} bytes, not the {size} its manifest lists"
        if hash_fd(fd, st.st_size) != digest:
            return f"{name}: content differs from the manifest"
    return None


def _unlisted(root_fd: int, listed: set[str]) -> list[str]:
    """What the directory holds that `listed` does not name: files, links (never
    followed), special files, and directories too deep to enter, each once; walked by
    descriptor with an explicit stack (no recursion, at most MAX_DEPTH levels)."""
    found = []
    pending: list[tuple[int, str, int]] = [(os.dup(root_fd), "", 0)]
    while pending:
        fd, prefix, depth = pending.pop()
        with opened(fd):
            try:
                with os.scandir(fd) as it:
                    items = sorted((item.name, item.stat(follow_symlinks=False)) for item in it)
            except OSError:
                continue
            for name, st in items:
                rel = f"{prefix}{name}"
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 >= MAX_DEPTH:
                        found.append(f"{rel}/ (more than {MAX_DEPTH} levels deep)")
                        continue
                    try:
                        pending.append((open_path(fd, name), f"{rel}/", depth + 1))
                    except OSError:
                        found.append(f"{rel}/ (cannot be entered)")
                elif stat.S_ISLNK(st.st_mode):
                    found.append(f"{rel} (a symbolic link)")
                elif not stat.S_ISREG(st.st_mode):
                    found.append(f"{rel} (not a regular file)")
                elif rel not in listed:
                    found.append(rel)
    return sorted(found)


def identity_problems(components: list[str], manifest: dict[str, Any], statement: dict[str, Any] | None
                      ) -> list[str]:
    """Whether the version at a path ending in `components` (`[..., recipe, N]` or
    `[..., recipe, target, N]`) is that version: its manifest's recipe, target and version,
    and its provenance statement's (when it has one), name the same. One line each."""
    target = manifest.get("target") if isinstance(manifest.get("target"), str) else None
    want = components[-3:] if target is not None else components[-2:]
    if len(want) < (3 if target is not None else 2) or version_number(want[-1]) is None:
        return [f"{MANIFEST}: says {_said(manifest)}, which its path does not name"]
    recipe, number = want[0], int(want[-1])
    problems = []
    said = _said(manifest)
    path_says = "/".join(want)
    if manifest.get("recipe") != recipe or (target is not None and want[1] != target) \
            or manifest.get("version") != number or isinstance(manifest.get("version"), bool):
        problems.append(f"{MANIFEST}: says {said}, not {path_says} (a version copied from elsewhere?)")
    if statement is not None:
        try:
            build = statement["predicate"]["buildDefinition"]["externalParameters"]
            stated = (build["recipe"]["name"], build.get("target"),
                      statement["predicate"]["runDetails"]["metadata"]["invocationId"])
        except (KeyError, TypeError):
            return problems + [f"{PROVENANCE}: not a provenance statement tpubuild wrote"]
        if stated != (recipe, target if target is not None else None, path_says):
            problems.append(f"{PROVENANCE}: says {stated[2]!r}, not {path_says} (a version copied from elsewhere?)")
    return problems


def _said(manifest: dict[str, Any]) -> str:
    parts = [manifest.get("recipe"), *([manifest["target"]] if manifest.get("target") else []),
             manifest.get("version")]
    return "/".join(str(p) for p in parts)
