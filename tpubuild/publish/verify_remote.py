"""`tpubuild verify URL`: a version on a publish destination (s3://, gs://, file://)
brought into verify's own temporary directory, then checked there as a local one
(publish/version_check.py).

A destination is written by many (issue 46): each listed object key is data. A key
becomes a local path only when it is a clean relative name (fs/names.py: no `..`, no
absolute start, no `//`), and its path, resolved, must lie inside the temporary
directory; anything else is one line and a failed verify, never a write elsewhere. Only
what the manifest lists is downloaded, each no larger than the manifest says (`sizes`)
or, for a manifest without sizes, than the listing says; an object the manifest does not
list is reported, not fetched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tpubuild.errors import TpubuildError, UsageError
from tpubuild.fs import clean_relative, version_number
from tpubuild.publish.version_check import DESCRIPTION_LIMIT, OWN
from tpubuild.publish.targets import MANIFEST

GIVE = "give a version: <destination>/<recipe>/<N> or <destination>/<recipe>/<target>/<N>"


class VerifyError(TpubuildError):
    """The destination could not be read (unreachable, refused): one line naming the URL."""

    exit_code = 1


def fetch_version(url: str, into: Path, timeouts: Any = None) -> tuple[list[str], set[str]]:
    """Every object the manifest of the version at `url` lists, downloaded into `into`
    (a fresh directory of verify's own) under its clean relative name. Returns (problems
    found before any hashing, one line each; names the manifest lists that were not
    downloaded). A URL that names no version is a UsageError (exit 2); a destination that
    cannot be read, a VerifyError (exit 1)."""
    if version_number(url.rsplit("/", 1)[-1]) is None:
        raise UsageError(f"{url}: not a version ({GIVE})")
    parts = urlsplit(url)
    if parts.scheme == "file" and not os.path.isdir(parts.path):
        # The recipe's folder's parent (the destination, or a recipe for a target version)
        # absent: the share is not there, a failed read (exit 1); else no such version (exit 2).
        if not os.path.isdir(os.path.dirname(os.path.dirname(parts.path.rstrip("/")))):
            raise VerifyError(f"{url}: no such directory (is the share mounted?)")
        raise UsageError(f"{url}: nothing there ({GIVE})")
    from tpubuild.transport import open_backend

    io = open_backend(url, timeouts, layout="", what="verify")
    call = _caller(url)
    listed = call("cannot list it", lambda: io.list(""))
    problems: list[str] = []
    objects: dict[str, int] = {}
    for rel, size, _mtime in listed:
        name = clean_relative(rel)
        if name is None:
            problems.append(f"{rel!r}: an object whose name is not a clean relative path; not downloaded")
            continue
        if any(part.startswith(".") for part in name.split("/")):
            continue  # a writer's temp file (file://), never part of a version
        objects[name] = size
    if not objects and not problems:
        raise UsageError(f"{url}: nothing there ({GIVE})")
    if MANIFEST not in objects:
        raise VerifyError(f"{url}: no {MANIFEST} at its top: not a version tpubuild published")
    into.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(into)
    fetch = lambda name, limit: _download(io, call, root, name, limit)  # noqa: E731 - one call site per kind
    problem = fetch(MANIFEST, DESCRIPTION_LIMIT)
    if problem:
        return [*problems, problem], set()
    try:
        manifest = json.loads(Path(root, MANIFEST).read_bytes())
    except ValueError:
        manifest = None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return [*problems, f"{MANIFEST}: unreadable (not a version tpubuild published)"], set()
    sizes = manifest.get("sizes") if isinstance(manifest.get("sizes"), dict) else {}
    withheld = set()
    for name, size in sorted(objects.items()):
        if name == MANIFEST:
            continue
        if name in OWN:
            limit = DESCRIPTION_LIMIT
        elif name in files:
            expected = sizes.get(name)
            if isinstance(expected, int) and not isinstance(expected, bool) and size != expected:
                more = "more than" if size > expected else "not"
                problems.append(f"{name}: {size} bytes, {more} the {expected} its manifest lists; not downloaded")
                withheld.add(name)
                continue
            limit = size
        else:
            problems.append(f"{name}: not in the manifest")
            continue
        problem = fetch(name, limit)
        if problem:
            problems.append(problem)
            withheld.add(name)
    return problems, withheld


def _download(io: Any, call: Callable[..., Any], root: str, name: str, limit: int) -> str | None:
    """One object into `root/name`, no larger than `limit`; a problem line or None."""
    from tpubuild.transport import ObjectTooLarge

    path = os.path.join(root, *name.split("/"))
    if os.path.commonpath([root, os.path.realpath(os.path.dirname(path))]) != root:
        return f"{name}: would be written outside verify's directory; not downloaded"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError:  # `a` listed as an object and as a folder of `a/b`
        return f"{name}: its folder is also an object; not downloaded"
    if os.path.lexists(path) or os.path.commonpath([root, os.path.realpath(path)]) != root:
        return f"{name}: listed twice or through a link; not downloaded"
    try:
        call(f"cannot download {name}", lambda: io.download(name, path, limit))
    except ObjectTooLarge as exc:
        return f"{name}: {exc.size} bytes, more than the {exc.limit} expected; not downloaded"
    except FileNotFoundError:
        return f"{name}: listed, then gone (or not a regular file); not downloaded"
    return None


def _caller(url: str) -> Callable[[str, Callable[[], Any]], Any]:
    """`call(what, fn)`: fn() with a backend's own errors said as one line naming the URL
    (FileNotFoundError and ObjectTooLarge are answers, raised as they are)."""
    from tpubuild.transport import ObjectTooLarge

    def call(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (FileNotFoundError, ObjectTooLarge, TpubuildError):
            raise
        except Exception as exc:  # noqa: BLE001 - the SDKs raise their own types (botocore, aiohttp, google.auth)
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise VerifyError(f"{url}: {what}: {reason}") from None

    return call
