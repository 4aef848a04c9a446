"""A publish destination's layout under `<url>/<recipe>/` (publish/destination.py says
it whole), what its listing and seals read as (`Survey`, `Tree`), what a publish did
(`Outcome`), and `DestinationBase`, which every part of a `Destination` stands on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpubuild.errors import TpubuildError
from tpubuild.fs import clean_relative, inside
from tpubuild.provenance.statement import PROVENANCE, SIGNATURE
from tpubuild.publish.targets import MANIFEST


STATE = ".tpubuild"
CLAIMS = f"{STATE}/claims"
STAGING = f"{STATE}/staging"
SEALED = f"{STATE}/sealed"
# What the SavedModel loader looks for first (tensorflow/cc/saved_model/loader.cc
# MaybeSavedModelDirectory: saved_model.pb or saved_model.pbtxt): written last, deleted first.
COMMIT_FILES = ("saved_model.pb", "saved_model.pbtxt")
OWN = (MANIFEST, PROVENANCE, SIGNATURE)  # files that describe a version (versions.OWN_FILES)
MAX_CLAIM_TRIES = 1000
# A claim's job is taken for gone this long after its own deadline passed (clocks of two
# machines differ; a job past its deadline stops before it seals).
CLOCK_MARGIN = 600.0
# What `remove` of an unsealed staging without any claim waits for (a claim removed by hand).
UNCLAIMED_AGE = 86400.0
# TF Serving's own reading of a version number: safe_strto64 (sign and digits, within int64).
TF_SERVING_NUMBER = re.compile(r"[+-]?[0-9]+")
# A number more than this far above the one below it (0 for the first) is no number
# tpubuild took: each claim is one more than the highest number used, so a gap this wide is
# a co-writer's object (a claim of 9223372036854775807 would push every later version past
# what TF Serving reads). It and every number above it are ignored, with a warning.
MAX_GAP = 1000
# A tree a file:// destination renamed aside to delete it (transport/backends.py remove_tree).
TRASH = re.compile(r"\..+\.trash")
# A file:// create's temp file (transport/backends.py _temp_copy: `.<name>.<pid>.<hex>.tmp`),
# left in claims/ or sealed/ by a writer killed before its link.
TEMP = re.compile(r"\.([0-9]+)\.[0-9]+\.[0-9a-f]+\.tmp")


class DestinationError(TpubuildError):
    """The destination cannot be used (unreachable, refused, a version that does not
    check): one line; nothing visible was left half-written. `unreachable`: the store
    itself failed (a build then stops asking it)."""

    exit_code = 1

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable
        self.cause: BaseException | None = None  # the transport's own error, when one is behind it


@dataclass
class Tree:
    """One version directory to publish: `<recipe>/<N>` or `<recipe>/<target>/<N>`,
    staged at `staged`; `files`: path in the directory -> (size, BLAKE3)."""

    final: str
    staged: str
    files: dict[str, tuple[int, str]]

    @property
    def commit(self) -> list[str]:
        """What arrives last: saved_model.pb where there is one, else the manifest."""
        found = [name for name in COMMIT_FILES if name in self.files]
        return found or [MANIFEST]

    def to_json(self) -> dict[str, Any]:
        return {"final": self.final, "staged": self.staged, "files": {k: list(v) for k, v in sorted(self.files.items())}}

    @classmethod
    def of(cls, data: Any, recipe: str, number: int) -> Tree:
        """A tree of the seal `<recipe>/.tpubuild/sealed/<number>`, its names exactly as
        `to_destination.local_trees` writes them for that number (`<recipe>/<N>` staged at
        `<recipe>/.tpubuild/staging/<N>/version`, `<recipe>/<target>/<N>` at
        `.../targets/<target>`) and its files clean relative names with a size and a
        BLAKE3: else a ValueError (TypeError) saying what is wrong (a seal is data a co-writer can write)."""
        if not isinstance(data, dict):
            raise TypeError("a tree is not an object")
        final, staged, files = data.get("final"), data.get("staged"), data.get("files")
        target = inside(final, recipe)
        parts = target.split("/") if target else []
        if parts == [str(number)]:
            expect = f"{recipe}/{STAGING}/{number}/version"
        elif len(parts) == 2 and parts[1] == str(number) and not parts[0].startswith("."):
            expect = f"{recipe}/{STAGING}/{number}/targets/{parts[0]}"
        else:
            raise ValueError(f"final {str(final)[:100]!r} is not {recipe}/{number} nor {recipe}/<target>/{number}")
        if staged != expect:
            raise ValueError(f"staged {str(staged)[:100]!r} is not {expect}")
        if not isinstance(files, dict) or not files:
            raise ValueError("files is not an object of names")
        out = {}
        for name, entry in files.items():
            if clean_relative(name) is None:
                raise ValueError(f"file name {str(name)[:100]!r} is not a clean relative path")
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)
                    and not isinstance(entry[0], bool) and entry[0] >= 0 and isinstance(entry[1], str)
                    and re.fullmatch(r"[0-9a-f]{64}", entry[1])):
                raise ValueError(f"file {name!r} has no size and BLAKE3")
            out[name] = (entry[0], entry[1])
        return cls(str(final), str(staged), out)


@dataclass
class Survey:
    """What one listing of `<url>/<recipe>/` shows."""

    recipe: str
    versions: dict[int, dict[str, int]] = field(default_factory=dict)  # N -> {path in <N>/: size}
    targets: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)
    claims: dict[int, float] = field(default_factory=dict)  # N -> the claim's modification time
    sealed: set[int] = field(default_factory=set)
    staged: dict[int, float] = field(default_factory=dict)  # N -> newest staged object's time
    numbered: set[int] = field(default_factory=set)  # every name TF Serving reads as a number
    trash: set[str] = field(default_factory=set)  # on a mount: trees a killed removal renamed aside
    # On a mount: temp files of killed claims and seals, path -> (the number, its time).
    temps: dict[str, tuple[int, float]] = field(default_factory=dict)

    def complete(self, number: int) -> bool:
        """Whether `<N>/` holds its commit file (what makes it loadable)."""
        return any(name in self.versions.get(number, {}) for name in COMMIT_FILES)

    def complete_numbers(self) -> list[int]:
        return sorted(n for n in self.versions if self.complete(n))

    def used(self) -> set[int]:
        return set(self.claims) | self.numbered | set(self.sealed) | set(self.staged)


@dataclass
class Outcome:
    """A recipe's publish to its destination: the version that holds its model there, and
    whether this publish made it (`new`); what it finished or removed of killed jobs."""

    url: str
    number: int
    new: bool
    mended: list[str] = field(default_factory=list)
    pruned: list[int] = field(default_factory=list)

    @property
    def version_url(self) -> str:
        """Where the version is: `<base path>/<N>`, or a registry's `<repository>:<N>`."""
        return f"{self.url}:{self.number}" if self.url.startswith("oci://") else f"{self.url}/{self.number}"

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "version": self.number, "new": self.new, "mended": self.mended,
                "pruned": self.pruned}


class DestinationBase:
    """What every part of a Destination (publish/destination.py) stands on: the URL, its
    backend opened on first use, warnings said once, backend errors said as one line.
    Every backend error but "absent" and "exists" becomes a DestinationError naming the URL."""

    def __init__(self, url: str, timeouts: Any = None, io: Any = None,
                 say: Callable[[str], None] | None = None):
        self.url = url.rstrip("/")
        self.timeouts = timeouts
        self._io = io
        # Where warnings go (what the destination holds that tpubuild left alone): publish
        # and `clean --remote` set it; each line is said once per Destination.
        self.say = say or (lambda line: None)
        self._said: set[str] = set()

    def warn(self, line: str) -> None:
        line = f"warning: publish_to {self.url}: {line}"
        if line not in self._said:
            self._said.add(line)
            self.say(line)

    def say_left(self) -> None:
        """What a removal on a mount could not remove (transport/mount.py), a line each."""
        left = getattr(self._io, "left", None)
        while left:
            self.warn(left.pop(0))

    @property
    def io(self) -> Any:
        if self._io is None:
            from urllib.parse import urlsplit

            from tpubuild.transport import open_backend

            parts = urlsplit(self.url)
            if parts.scheme == "file" and not os.path.isdir(parts.path):
                # A mount that is not there: writing would fill the local disk below its mount point.
                raise DestinationError(f"publish_to {self.url}: no such directory (is the share mounted?)",
                                       unreachable=True)
            self._io = open_backend(self.url, self.timeouts, layout="", what="publish_to")
        return self._io

    def base_path(self, recipe: str) -> str:
        """TF Serving's `--model_base_path` of the recipe."""
        return f"{self.url}/{recipe}"

    def version_url(self, recipe: str, number: int, target: str | None = None) -> str:
        return f"{self.base_path(recipe)}/{f'{target}/' if target else ''}{number}"

    def call(self, what: str, fn: Callable[..., Any]) -> Any:  # a lambda binding its loop values as defaults
        """`fn()` with the backend's own errors said as one line (FileNotFoundError and
        FileExistsError are answers, raised as they are)."""
        try:
            return fn()
        except (FileNotFoundError, FileExistsError, DestinationError):
            raise
        except TpubuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDKs raise their own types (botocore, aiohttp, google.auth)
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise DestinationError(f"publish_to {self.url}: {what}: {reason}", unreachable=True) from exc


def commit_rels(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}/{name}" for name in COMMIT_FILES)
