"""Reading a publish destination (a part of `Destination`, publish/destination.py): one
listing of a recipe's base path, every name checked before it means anything; manifests;
and which version already holds a build's model, by its bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpubuild.fs import INT64_MAX, clean_relative, inside, version_number
from tpubuild.publish.dest_state import (
    MAX_GAP,
    STATE,
    TEMP,
    TF_SERVING_NUMBER,
    TRASH,
    DestinationBase,
    Survey,
)
from tpubuild.publish.targets import MANIFEST


class DestinationReading(DestinationBase):
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
        wanted = model_files(manifest)
        listed = model_files(theirs)
        if wanted is None or listed is None or listed != wanted:
            self.warn(f"{survey.recipe}/{number} does not hold what its manifest says (its files are not this "
                      "model's); a new version is published")
            return None
        why = self._bytes_differ(survey, number, all_files(theirs) or {}, scratch)
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



def _download(io: Any, rel: str, local: str, limit: int) -> int:
    """`io.download`, with an object grown past `limit` since its listing said as -1 bytes."""
    from tpubuild.transport import ObjectTooLarge

    try:
        return io.download(rel, local, limit)
    except ObjectTooLarge:
        return -1



def all_files(manifest: dict[str, Any]) -> dict[str, str] | None:
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



def model_files(manifest: dict[str, Any]) -> dict[str, str] | None:
    """`all_files` but the report's (figures measured on the building machine, which two
    builds of one model may differ in: what the manifest's `model` digest leaves out)."""
    from tpubuild.report.formats import REPORT_JSON, REPORT_MD
    from tpubuild.stages.report import HLO_DIR

    files = all_files(manifest)
    if files is None:
        return None
    return {key: digest for key, digest in files.items()
            if not (key in (f"\0{REPORT_JSON}", f"\0{REPORT_MD}") or key.startswith(f"\0{HLO_DIR}/"))}
