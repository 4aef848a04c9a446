"""A stage record (`v1/stages/ab/<key>.json`) and the one validator every record passes,
whether it was read from the local store or downloaded from a remote cache.

A record names the files a checkout writes; whoever can write the cache directory can
write a record. So a record is used only when it names its own key, hashes to it (its key
record), lists safe relative paths and well-formed digests, and its tree hash is its
files'. Each file's content is then checked against its digest when it is materialized.
A local record must also carry a MAC made with this user's key (store/record_mac.py,
checked by Store.get): that is what ties its output to the key it is stored under.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tpubuild.digests import SCHEME, FileEntry, hash_bytes, tree_digest
from tpubuild.keys.stage import canonical_dumps, stage_key

DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A stage record (or a discovered-input candidate) is JSON naming files: far below this.
RECORD_LIMIT = 64 << 20


@dataclass
class StageEntry:
    """A stage output in the store."""

    key: str
    stage: str
    tree: str
    files: list[FileEntry]
    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    # The peak resident set of the worker that built it (bytes), measured on the building
    # machine: a cached stage keeps the figure of its build (lock files' `peak_memory`).
    peak_memory: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scheme": SCHEME,
            "key": self.key,
            "stage": self.stage,
            "tree": self.tree,
            "files": [[f.path, f.hash, f.size] for f in self.files],
            "summary": self.summary,
            "warnings": self.warnings,
            "record": self.record,
            "created": time.time(),
            **({"peak_memory": self.peak_memory} if self.peak_memory is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageEntry:
        return cls(
            key=data["key"],
            stage=data["stage"],
            tree=data["tree"],
            files=[FileEntry(p, h, s) for p, h, s in data["files"]],
            summary=data.get("summary", {}),
            warnings=data.get("warnings", []),
            record=data.get("record", {}),
            peak_memory=_bytes_or_none(data.get("peak_memory")),
        )


def _bytes_or_none(value: Any) -> int | None:
    """A measured byte count as a record holds it, else None (a record of an older tpubuild)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def discovered_final_key(declared_key: str, discovered: dict[str, str]) -> str:
    """The key a user-code stage's record is stored under (engine/resolver.py add_discovered)."""
    return hash_bytes(canonical_dumps({"key": declared_key, "discovered": discovered}).encode())


def parse_candidate(declared_key: str, data: Any) -> dict[str, Any] | None:
    """A discovered-input candidate of `declared_key` ({"files": {path: hash}, "key": final
    key}) when it is well formed and its key is the final key of its files, else None.
    Whoever can write a cache (local or remote) can write a candidate; its key taken as
    written would send the lookup to any record of the user's own, another stage's (a
    bfloat16 lookup answered with the raw export), so it is recomputed, never read."""
    if not isinstance(data, dict):
        return None
    files, final = data.get("files"), data.get("key")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    if final != discovered_final_key(declared_key, files):
        return None
    return {"files": files, "key": final}


def record_key(record: dict[str, Any]) -> str:
    """The key that a stored key record must be stored under."""
    if "discovered" in record:
        declared = stage_key({k: v for k, v in record.items() if k != "discovered"})
        return discovered_final_key(declared, record["discovered"])
    return stage_key(record)


def parse_entry(key: str, raw: bytes, hash_record: bool = True) -> tuple[StageEntry | None, str]:
    """The StageEntry in a record, or (None, what is wrong with it). The record must name
    `key`, list safe relative paths and well-formed digests, its tree hash must be its
    files', and (`hash_record`, for downloaded records) its key record must hash to `key`.
    A local record skips that last check only: whoever could forge one could as well forge
    a record that hashes right; what keeps a forged record out is its MAC (Store.get), and
    what keeps even a trusted one harmless is that it can name no path outside its tree."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            return None, "not a JSON object"
        if data.get("scheme") != SCHEME:
            return None, f"scheme {data.get('scheme')!r}, expected {SCHEME}"
        if data.get("key") != key:
            return None, f"it names the key {data.get('key')!r}"
        entry = StageEntry.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]
    for f in entry.files:
        if not (isinstance(f.path, str) and safe_path(f.path)):
            return None, f"unsafe path {f.path!r}"
        if not (isinstance(f.hash, str) and DIGEST.match(f.hash)) or not isinstance(f.size, int) or f.size < 0:
            return None, f"bad object entry for {f.path!r}"
    if entry.tree != tree_digest(entry.files):
        return None, "its tree hash is not its files'"
    if not hash_record:
        return entry, ""
    try:
        if record_key(entry.record) != key:
            return None, "its key record does not hash to its key"
    except (TypeError, ValueError):
        return None, "its key record is not hashable"
    return entry, ""


def safe_path(path: str) -> bool:
    """A relative POSIX path that stays inside its tree (a record must never make a
    checkout write outside it)."""
    return not path.startswith("/") and "\\" not in path and "\0" not in path and all(
        part not in ("", ".", "..") for part in path.split("/"))
