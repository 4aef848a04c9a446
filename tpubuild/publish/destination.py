"""Versions published where servers read them (`publish_to:` in tpubuild.yaml, or a
recipe's own): any fsspec URL the remote extra's backends open (s3://, gs://, file://
for a shared mount), beside the local `out/`. docs/publish-to-object-storage.md says
what a server polling the destination can observe and when.

Layout under `<url>/<recipe>/`, TF Serving's base path of the recipe:
- `<N>/`, `<target>/<N>/`: the versions, as in the local `out/<recipe>/`.
- `.tpubuild/claims/<N>`: one object per number ever taken, written create-only (S3
  `If-None-Match: *`, GCS `ifGenerationMatch=0`, O_EXCL on a mount: transport/backends.py
  `create`): the store, not a machine, hands out numbers, and a number claimed by a job
  that was then killed is never taken again (claims are never deleted, not by pruning nor
  by `clean`).
- `.tpubuild/staging/<N>/version/`, `.tpubuild/staging/<N>/targets/<target>/`: the
  version being uploaded, then checked object by object (size, then BLAKE3 against the
  manifest) before anything of it appears under `<N>/`.
- `.tpubuild/sealed/<N>`: written create-only once every staged object checked; it lists
  what to copy where. From then on anyone may finish the version (copies of checked
  bytes, the same whoever makes them): the next publish completes a sealed version a
  killed job left, and removes an unsealed staging whose job is gone.

TF Serving sees none of `.tpubuild/`: its FileSystemStoragePathSource aspires only the
children of the base path whose name parses as an int64
(tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc,
ParseVersionNumber/IndexChildrenByVersion; on GCS and S3 it takes each listed name's first
path component). On an object store a version appears object by object (there is no
rename): `saved_model.pb` last, each other object checked present and whole before it,
because the SavedModel loader treats a directory without `saved_model.pb` as no model
(tensorflow/cc/saved_model/loader.cc MaybeSavedModelDirectory, a NOT_FOUND TF Serving
retries: loader_harness.cc, `max_num_load_retries`) but one without
`variables/variables.index` as a model without variables ("no checkpoints were
restored": served with uninitialized variables). On a mount the staged directory is
renamed into place: every file appears at one instant.

A destination is written by many (every CI job, a group mount's users): every name, number
and document read from it is data, checked before it becomes a path, a number or a verdict
(fs/names.py; on a mount no link is followed below the root: transport/mount.py), and a version
counts as a recipe's model only by its bytes. What is not what tpubuild writes is left alone
with one warning line. docs/publish-to-object-storage.md "Trust model".
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.errors import TpubuildError
from tpubuild.fs import INT64_MAX, clean_relative, inside, version_number
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

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "version": self.number, "new": self.new, "mended": self.mended,
                "pruned": self.pruned}


class Destination:
    """One publish destination, `url` (its backend rooted at the URL itself). Every backend
    error but "absent" and "exists" becomes a DestinationError naming the URL."""

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

    # --- reading --------------------------------------------------------------------
    def survey(self, recipe: str) -> Survey:
        """One listing of `<recipe>/`, every name checked before it means anything: a
        version or claim is a decimal int64 (fs/names.py version_number), every path clean
        and below the base path; anything else is left alone with one warning line."""
        found = Survey(recipe)
        odd: list[str] = []
        listed = self.call(f"cannot list {recipe}/", lambda: self.io.list(f"{recipe}/"))
        for rel, size, mtime in listed:
            below = inside(rel, recipe)
            if below is None:
                if isinstance(rel, str) and rel.startswith(f"{recipe}/"):
                    odd.append(rel)
                continue
            parts = below.split("/")
            aside = next((i for i, part in enumerate(parts[:-1]) if TRASH.fullmatch(part)), None)
            if aside is not None:
                found.trash.add("/".join([recipe, *parts[:aside + 1]]))
                continue
            if len(parts) < 2:
                continue
            head = parts[0]
            if TF_SERVING_NUMBER.fullmatch(head):
                self._numbered(found, f"{recipe}/{head}", head)
                number = version_number(head)
                if number is not None:
                    found.versions.setdefault(number, {})["/".join(parts[1:])] = size
            elif head == STATE:
                if len(parts) < 3 or parts[1] not in ("claims", "sealed", "staging"):
                    continue
                number = version_number(parts[2])
                if number is None or (parts[1] != "staging" and len(parts) != 3):
                    odd.append(rel)
                elif parts[1] == "claims":
                    found.claims[number] = mtime
                elif parts[1] == "sealed":
                    found.sealed.add(number)
                else:
                    found.staged[number] = max(mtime, found.staged.get(number, 0.0))
            elif len(parts) >= 3 and TF_SERVING_NUMBER.fullmatch(parts[1]) and not head.startswith("."):
                self._numbered(found, f"{recipe}/{head}/{parts[1]}", parts[1])
                number = version_number(parts[1])
                if number is not None:
                    found.targets.setdefault(head, {}).setdefault(number, {})["/".join(parts[2:])] = size
        # On a mount, a directory is a number taken even empty (`mkdir toy/2`): never claimed.
        directories = getattr(self.io, "directories", None)
        if directories is not None:
            for rel in self.call(f"cannot list {recipe}/", lambda: directories(f"{recipe}/")):
                parts = (inside(rel, recipe) or "").split("/")
                if len(parts) == 1 and TF_SERVING_NUMBER.fullmatch(parts[0]):
                    self._numbered(found, rel, parts[0])
                elif len(parts) == 2 and TF_SERVING_NUMBER.fullmatch(parts[1]) and not parts[0].startswith("."):
                    self._numbered(found, rel, parts[1])
        temps = self.call(f"cannot list {recipe}/{STATE}/", lambda: self.io.temps(f"{recipe}/{STATE}/"))
        for rel, _size, mtime in temps:
            if clean_relative(rel) is None:
                continue
            parts = rel.split("/")
            if len(parts) == 4 and parts[2] in ("claims", "sealed") and (temp := TEMP.fullmatch(parts[3])):
                if version_number(temp.group(1)) is not None:
                    found.temps[rel] = (int(temp.group(1)), mtime)
            elif len(parts) > 4 and parts[2] == "staging" and (number := version_number(parts[3])) is not None:
                # A staging whose only file is an upload a kill cut short is a staging too.
                found.staged[number] = max(mtime, found.staged.get(number, 0.0))
        if odd:
            odd.sort()
            more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
            self.warn(f"{json.dumps(odd[0][:200], ensure_ascii=False)}{more}: not a name tpubuild writes; left alone")
        self._drop_far(found)
        return found

    def _numbered(self, found: Survey, where: str, name: str) -> None:
        """A name TF Serving reads as a version number (safe_strto64: sign, digits, within
        int64): that number is taken. Past int64 TF Serving skips it, and so does tpubuild."""
        value = int(name) if len(name.lstrip("+-0")) <= 19 else None  # more digits: past int64 (and int()'s limit)
        if value is not None and 0 <= value <= INT64_MAX:
            found.numbered.add(value)
        else:
            self.warn(f"{json.dumps(where[:200], ensure_ascii=False)}: no version TF Serving reads (its number is "
                      "not within int64); left alone")

    def _drop_far(self, found: Survey) -> None:
        """Ignore every number more than MAX_GAP above the number below it, and all above."""
        previous = 0
        for number in sorted(found.used()):
            if number - previous > MAX_GAP:
                break
            previous = number
        else:
            return
        self.warn(f"{found.recipe}: {number} is more than {MAX_GAP} above the highest number before it "
                  f"({previous}): not a number tpubuild took; it and any above it are ignored")
        found.claims = {n: t for n, t in found.claims.items() if n <= previous}
        found.staged = {n: t for n, t in found.staged.items() if n <= previous}
        found.sealed = {n for n in found.sealed if n <= previous}
        found.numbered = {n for n in found.numbered if n <= previous}
        found.versions = {n: v for n, v in found.versions.items() if n <= previous}
        found.targets = {t: {n: v for n, v in by.items() if n <= previous} for t, by in found.targets.items()}
        found.temps = {r: (n, t) for r, (n, t) in found.temps.items() if n <= previous}

    def read_json(self, rel: str) -> dict[str, Any] | None:
        """A small JSON document of the destination (a seal, a manifest): None when absent,
        not JSON, or larger than any document tpubuild writes (a co-writer's 200 GiB "seal"
        is not read)."""
        from tpubuild.publish.version_check import DESCRIPTION_LIMIT
        from tpubuild.transport import ObjectTooLarge

        try:
            data = json.loads(self.call(f"cannot read {rel}", lambda: self.io.read(rel, DESCRIPTION_LIMIT)))
        except (FileNotFoundError, ValueError, ObjectTooLarge):
            return None
        return data if isinstance(data, dict) else None

    def manifest(self, recipe: str, number: int) -> dict[str, Any] | None:
        return self.read_json(f"{recipe}/{number}/{MANIFEST}")

    def newest_same_model(self, survey: Survey, manifest: dict[str, Any], scratch: Path) -> int | None:
        """The newest complete version's number when it holds the model of the local
        `manifest`: its manifest names the recipe and the same `model`, lists the same
        model files (every file but the report's) with the same BLAKE3, and the bytes
        there hash to what it lists. A manifest is data anyone who can write the
        destination can copy: what vouches for a version is its bytes, hashed here (only
        when the manifest claims the same model, so the cost is a download of a version
        that would otherwise be published again). A version whose bytes are not what its
        manifest says is said in one warning line; the build then publishes a new one."""
        numbers = survey.complete_numbers()
        if not numbers:
            return None
        number = numbers[-1]
        theirs = self.manifest(survey.recipe, number)
        if not theirs or theirs.get("model") != manifest.get("model") or theirs.get("recipe") != survey.recipe:
            return None
        wanted = _model_files(manifest)
        listed = _model_files(theirs)
        if wanted is None or listed is None or listed != wanted:
            self.warn(f"{survey.recipe}/{number} does not hold what its manifest says (its files are not this "
                      "model's); a new version is published")
            return None
        why = self._bytes_differ(survey, number, _all_files(theirs) or {}, scratch)
        if why is not None:
            self.warn(f"{survey.recipe}/{number} does not hold what its manifest says ({why}); a new version is "
                      "published")
            return None
        return number

    def _bytes_differ(self, survey: Survey, number: int, files: dict[str, str], scratch: Path) -> str | None:
        """None when every file `files` lists (path in the version, `<target>/` first for a
        target version's) is at the destination, a regular object whose BLAKE3 is the one
        listed; else the first that is not, in words."""
        from tpubuild.digests import hash_file

        recipe = survey.recipe
        probe = os.fspath(Path(scratch) / f"vouch-{os.getpid()}")
        try:
            for key, digest in sorted(files.items()):
                target, _, rel = key.partition("\0")
                size = (survey.targets.get(target, {}).get(number, {}) if target else
                        survey.versions.get(number, {})).get(rel)
                where = f"{recipe}/{target}/{number}/{rel}" if target else f"{recipe}/{number}/{rel}"
                if size is None:
                    return f"{where} is missing"
                try:
                    got = self.call(f"cannot read {where}", lambda w=where, n=size: _download(self.io, w, probe, n))
                except FileNotFoundError:
                    return f"{where} is missing"
                if got != size or hash_file(probe) != digest:
                    return f"{where} is other bytes"
        finally:
            try:
                os.unlink(probe)
            except FileNotFoundError:
                pass
        return None

    # --- numbers --------------------------------------------------------------------
    def claim(self, survey: Survey, budget: float) -> int:
        """A number no one else has or will have: one more than every number the listing
        shows (claims, versions, stagings), taken by a create-only claim object; when
        another job took it first, the next one. `budget`: the seconds this job gives
        itself to seal its staging (a cleaner waits that long, and CLOCK_MARGIN, before
        taking the job for gone)."""
        number = max(survey.used(), default=0) + 1
        if number + MAX_CLAIM_TRIES > INT64_MAX:  # unreachable after survey's MAX_GAP rule, but never past int64
            raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number left within int64")
        document = json.dumps({**_whoami(), "budget": round(budget, 1), "claimed": time.time()},
                              sort_keys=True).encode()
        for _ in range(MAX_CLAIM_TRIES):
            rel = f"{survey.recipe}/{CLAIMS}/{number}"
            if self.call(f"cannot claim version {number}", lambda r=rel: self.io.create(r, document)):
                survey.claims[number] = time.time()
                return number
            number += 1
        raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number free after "
                               f"{MAX_CLAIM_TRIES} tries (other jobs claimed them first)")

    # --- staging, sealing, promoting ------------------------------------------------
    def stage(self, trees: list[tuple[Tree, Path]], scratch: Path, deadline: float) -> None:
        """Upload each tree's files from its local directory to its staging name, then read
        every object back and check its size and BLAKE3. `deadline` (time.monotonic()): past
        it nothing more is written (a cleaner may take the claim for gone)."""
        for tree, local in trees:
            for rel in sorted(tree.files):
                _before(deadline, self.url)
                source, staged = os.fspath(local / rel), f"{tree.staged}/{rel}"
                self.call(f"cannot upload {staged}", lambda s=source, d=staged: self.io.upload(s, d))
        from tpubuild.digests import hash_file

        for tree, _local in trees:
            for rel, (size, digest) in sorted(tree.files.items()):
                _before(deadline, self.url)
                probe, staged = os.fspath(scratch / "read-back"), f"{tree.staged}/{rel}"
                try:
                    # More bytes than were sent: ObjectTooLarge, said by `call` as one line.
                    got = self.call(f"cannot read back {staged}",
                                    lambda s=staged, p=probe, n=size: self.io.download(s, p, n))
                except FileNotFoundError:
                    raise DestinationError(f"publish_to {self.url}: {tree.staged}/{rel} vanished after its upload "
                                           "(removed by another job that took this one for gone?)") from None
                if got != size or hash_file(probe) != digest:
                    raise DestinationError(f"publish_to {self.url}: {tree.staged}/{rel} does not read back as "
                                           f"uploaded ({got} bytes of {size}, or other bytes); nothing published")
                os.unlink(probe)

    def seal(self, recipe: str, number: int, trees: list[Tree], deadline: float) -> None:
        _before(deadline, self.url)
        document = json.dumps({"recipe": recipe, "number": number, "trees": [t.to_json() for t in trees]},
                              sort_keys=True).encode()
        rel = f"{recipe}/{SEALED}/{number}"
        if not self.call(f"cannot seal version {number}", lambda: self.io.create(rel, document)):
            raise DestinationError(f"publish_to {self.url}: {rel} exists: version {number} is another job's")

    def promote(self, trees: list[Tree]) -> None:
        """Make each staged tree visible under its final name, in order (the main version,
        then each target version). A directory is renamed whole. On an object store each
        object is copied, every one but the commit file first; they are checked present
        and whole in a listing; then the commit file is copied and checked. A staged
        object gone meanwhile means another job finished the version (mend): the tree
        must then be whole under its final name."""
        for tree in trees:
            try:
                self._promote_tree(tree)
            except FileExistsError:
                # `<N>/` is there already: another job finished it (then it is whole), or a
                # directory tpubuild did not make is (then nothing was written there).
                self.check_tree(tree, with_commit=True, wrote=False)
            except FileNotFoundError:
                self.check_tree(tree, with_commit=True)

    def _promote_tree(self, tree: Tree) -> None:
        if self.call(f"cannot rename {tree.staged}", lambda: self.io.rename_tree(tree.staged, tree.final)):
            return
        early = [rel for rel in sorted(tree.files) if rel not in tree.commit]
        for rel in early:
            self.call(f"cannot copy {tree.staged}/{rel}", lambda r=rel: self.io.copy(f"{tree.staged}/{r}",
                                                                                      f"{tree.final}/{r}"))
        self.check_tree(tree, with_commit=False)
        for rel in tree.commit:
            self.call(f"cannot copy {tree.staged}/{rel}", lambda r=rel: self.io.copy(f"{tree.staged}/{r}",
                                                                                      f"{tree.final}/{r}"))
        self.check_tree(tree, with_commit=True)

    def check_tree(self, tree: Tree, with_commit: bool, wrote: bool = True) -> None:
        """Every file of `tree` (its commit file too, when `with_commit`) listed under the
        final name with the size staged: a DestinationError naming the first that is not
        (`wrote`: whether this job copied anything there, for the message)."""
        listed = {rel[len(tree.final) + 1:]: size for rel, size, _ in
                  self.call(f"cannot list {tree.final}/", lambda: self.io.list(f"{tree.final}/"))
                  if rel.startswith(f"{tree.final}/")}
        for rel, (size, _digest) in sorted(tree.files.items()):
            if rel in tree.commit and not with_commit:
                continue
            if listed.get(rel) != size:
                seen = "missing" if rel not in listed else f"{listed[rel]} bytes, not {size}"
                if not wrote:
                    raise DestinationError(f"publish_to {self.url}: {tree.final}/ exists and is not this version "
                                           f"({rel} is {seen}: a directory tpubuild did not make?); nothing "
                                           "written there")
                raise DestinationError(f"publish_to {self.url}: {tree.final}/{rel} is {seen} after its copy; "
                                       f"{'its' if with_commit else 'no'} {tree.commit[0]} written")

    def unstage(self, recipe: str, number: int) -> None:
        """Remove a published version's staging, then its seal (either may be gone: the
        job that published it and one that finished it both remove them)."""
        for what, remove in ((f"{recipe}/{STAGING}/{number}", self.io.remove_tree),
                             (f"{recipe}/{SEALED}/{number}", lambda rel: self.io.delete([rel]))):
            try:
                self.call(f"cannot remove {what}", lambda w=what, r=remove: r(w))
            except FileNotFoundError:
                pass

    # --- what killed jobs left ------------------------------------------------------
    def mend(self, survey: Survey, say: Callable[[str], None]) -> list[str]:
        """Finish every sealed version (its bytes were checked; copying them again is
        harmless), and remove each unsealed staging whose job is gone: a job on this
        machine whose process ended, or one past its claim's budget (CLOCK_MARGIN after).
        Returns what was done, a line each."""
        done = []
        recipe = survey.recipe
        for number in sorted(survey.sealed):
            seal = self.read_json(f"{recipe}/{SEALED}/{number}")
            if seal is None:
                continue  # finished and removed meanwhile
            try:
                # Every name in it is checked: a seal is data anyone who can write the destination wrote.
                if seal.get("recipe") != recipe or seal.get("number") != number:
                    raise ValueError(f"it is not the seal of {recipe} version {number}")
                if not isinstance(seal.get("trees"), list) or not seal["trees"]:
                    raise ValueError("its trees are not a list of trees")
                trees = [Tree.of(t, recipe, number) for t in seal["trees"]]
            except (TypeError, ValueError) as exc:
                self.warn(f"{recipe}/{SEALED}/{number} is not a seal tpubuild wrote ({exc}); left in place")
                continue
            whole = all(self._tree_whole(survey, t) for t in trees)
            if not whole:
                try:
                    self.promote(trees)
                except FileNotFoundError:
                    continue  # its job finished and removed the staging meanwhile
                except DestinationError as exc:
                    if exc.unreachable:
                        raise
                    # A directory tpubuild did not make at `<N>/`, say: never fatal to this build.
                    self.warn(f"{recipe}/{SEALED}/{number}: cannot complete it ({str(exc).split(': ', 1)[-1]}); "
                              "left in place")
                    continue
                done.append(f"completed {self.base_path(recipe)}/{number} (a publish that stopped before it was)")
            self.unstage(recipe, number)
        now = time.time()
        for number, newest in sorted(survey.staged.items()):
            if number in survey.sealed:
                continue
            claim = self.read_json(f"{recipe}/{CLAIMS}/{number}") if number in survey.claims else None
            if _gone(claim, survey.claims.get(number), newest, now):
                self.call(f"cannot remove {recipe}/{STAGING}/{number}",
                          lambda n=number: self.io.remove_tree(f"{recipe}/{STAGING}/{n}"))
                done.append(f"removed {self.base_path(recipe)}/{STAGING}/{number} (a publish that stopped before it "
                            f"was sealed; number {number} stays unused)")
        for rel, (number, written) in sorted(survey.temps.items()):
            # A seal's temp goes with its claim's job; a claim's temp, whose number another
            # job may hold, once a day old (a create takes milliseconds).
            if f"/{SEALED}/" in rel:
                claim = self.read_json(f"{recipe}/{CLAIMS}/{number}") if number in survey.claims else None
                gone = _gone(claim, survey.claims.get(number), written, now)
            else:
                gone = now - written > UNCLAIMED_AGE
            if gone:
                self.call(f"cannot remove {rel}", lambda r=rel: self.io.delete([r]))
        for aside in sorted(survey.trash):  # a removal killed after its rename: nothing there is visible
            self.call(f"cannot remove {aside}", lambda a=aside: self.io.remove_tree(a))
        self.say_left()
        return done

    def _tree_whole(self, survey: Survey, tree: Tree) -> bool:
        """Whether the listing shows every file of `tree` (checked by Tree.of) whole."""
        parts = tree.final[len(survey.recipe) + 1:].split("/")
        number = int(parts[-1])
        listed = survey.versions.get(number, {}) if len(parts) == 1 else \
            survey.targets.get(parts[0], {}).get(number, {})
        return all(listed.get(name) == size for name, (size, _) in tree.files.items())

    # --- pruning and cleaning -------------------------------------------------------
    def published_reason(self, survey: Survey, number: int) -> str | None:
        """None when `<recipe>/<N>/` (and each target version of N) is a version tpubuild
        published: its manifest names the recipe and lists exactly the files there."""
        manifest = self.manifest(survey.recipe, number)
        if manifest is None:
            return f"no readable {MANIFEST}"
        if manifest.get("recipe") != survey.recipe:
            return f"its {MANIFEST} is for recipe {repr(manifest.get('recipe'))[:100]}"
        listed = _all_files(manifest)
        if listed is None:
            return f"its {MANIFEST} is not one tpubuild writes"
        if set(survey.versions.get(number, {})) - set(OWN) != {k[1:] for k in listed if k.startswith("\0")}:
            return f"it holds other files than its {MANIFEST} lists"
        for target in sorted({k.split("\0")[0] for k in listed} - {""}):
            present = survey.targets.get(target, {}).get(number)
            files = {k.split("\0", 1)[1] for k in listed if k.startswith(f"{target}\0")}
            if present is not None and set(present) - set(OWN) != files:
                return f"{target}/{number}/ holds other files than its {MANIFEST} lists"
        return None

    def newest_published(self, survey: Survey) -> int | None:
        """The newest complete version tpubuild published (published_reason says None)."""
        for number in reversed(survey.complete_numbers()):
            if self.published_reason(survey, number) is None:
                return number
        return None

    def remove_version(self, survey: Survey, number: int) -> None:
        """Target versions first, then the main one (publish's order reversed); in each, the
        commit file before the rest."""
        recipe = survey.recipe
        for target in sorted(survey.targets):
            if number in survey.targets[target]:
                self.call(f"cannot remove {recipe}/{target}/{number}",
                          lambda t=target: self.io.remove_tree(f"{recipe}/{t}/{number}/", first=_commit_rels(
                              f"{recipe}/{t}/{number}")))
        self.call(f"cannot remove {recipe}/{number}",
                  lambda: self.io.remove_tree(f"{recipe}/{number}/", first=_commit_rels(f"{recipe}/{number}")))
        self.say_left()

    def prune(self, survey: Survey, keep: int | None, pinned: set[int], say: Callable[[str], None],
              everything: bool = False) -> list[int]:
        """Remove the complete versions tpubuild published but the newest `keep` (all but
        the newest with `everything`: `clean`), never the newest nor a pinned one; a
        version that is not tpubuild's is left and said. The newest version TF Serving can
        load always stays: the newest complete one (a decimal int64: survey), and the newest
        tpubuild published, should a co-writer's newer one not load."""
        numbers = survey.complete_numbers()
        if not numbers or (keep is None and not everything):
            return []
        if everything:
            newest = numbers[-1:]
        else:
            assert keep is not None  # returned above when None
            newest = numbers[-keep:]
        kept = set(newest) | set(pinned)
        ours = self.newest_published(survey)
        if ours is not None:
            kept.add(ours)
        removed = []
        for number in numbers:
            if number in kept:
                continue
            why = self.published_reason(survey, number)
            if why is not None:
                say(f"warning: {self.base_path(survey.recipe)}/{number}: {why}; left in place")
                continue
            self.remove_version(survey, number)
            removed.append(number)
        return removed


def _download(io: Any, rel: str, local: str, limit: int) -> int:
    """`io.download`, with an object grown past `limit` since its listing said as -1 bytes."""
    from tpubuild.transport import ObjectTooLarge

    try:
        return io.download(rel, local, limit)
    except ObjectTooLarge:
        return -1


def _all_files(manifest: dict[str, Any]) -> dict[str, str] | None:
    """Every file a version's manifest lists, its target's name, a NUL and its path (the
    main version's: a NUL and its path) -> BLAKE3; None when the manifest is not what tpubuild writes (a name that
    is not a clean relative path, `files` or `targets` not an object, a digest not a string)."""
    out: dict[str, str] = {}
    targets = manifest.get("targets") or {}
    if not isinstance(targets, dict):
        return None
    listed = [("", manifest.get("files", {}))]
    for target, entry in targets.items():
        if clean_relative(target) is None or "/" in target or target.startswith(".") or not isinstance(entry, dict):
            return None
        listed.append((target, entry.get("files", {})))
    for target, files in listed:
        if not isinstance(files, dict):
            return None
        for rel, digest in files.items():
            if clean_relative(rel) is None or not isinstance(digest, str):
                return None
            out[f"{target}\0{rel}"] = digest
    return out


def _model_files(manifest: dict[str, Any]) -> dict[str, str] | None:
    """`_all_files` but the report's (figures measured on the building machine, which two
    builds of one model may differ in: what the manifest's `model` digest leaves out)."""
    from tpubuild.report.formats import REPORT_JSON, REPORT_MD
    from tpubuild.stages.report import HLO_DIR

    files = _all_files(manifest)
    if files is None:
        return None
    return {key: digest for key, digest in files.items()
            if not (key in (f"\0{REPORT_JSON}", f"\0{REPORT_MD}") or key.startswith(f"\0{HLO_DIR}/"))}


def _commit_rels(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}/{name}" for name in COMMIT_FILES)


def _before(deadline: float, url: str) -> None:
    if time.monotonic() > deadline:
        raise DestinationError(f"publish_to {url}: the upload took longer than its claim's budget; stopped before "
                               "sealing (the next publish removes the staging; the number stays unused)")


# --- whose claim -----------------------------------------------------------------------
def _machine() -> str:
    """This machine's boot and PID namespace: two processes with one value see each other's
    PIDs (two containers on one host share the boot id, not the namespace)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}:{namespace}"


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22): with
    the PID, names one process even after its PID is reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]


def _whoami() -> dict[str, Any]:
    return {"host": socket.gethostname(), "machine": _machine(), "pid": os.getpid(), "started": _started(os.getpid())}


def _gone(claim: dict[str, Any] | None, claimed: float | None, staged: float, now: float) -> bool:
    """Whether the job that staged a number has stopped for good: on this machine, its
    process ended; anywhere, its budget and CLOCK_MARGIN have passed since its claim."""
    if claim is None:
        return now - max(staged, claimed or 0.0) > UNCLAIMED_AGE
    machine = _machine()
    if machine and claim.get("machine") == machine and isinstance(claim.get("pid"), int) \
            and _started(claim["pid"]) != claim.get("started"):
        return True
    budget = claim.get("budget")
    start = claimed if claimed else staged
    return isinstance(budget, (int, float)) and now - start > budget + CLOCK_MARGIN
