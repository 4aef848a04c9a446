"""Stage cache keys: a full-length hash of everything that can change a stage's output."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import metadata
from typing import Any

from tpubuild import __version__
from tpubuild.engine.hashing import SCHEME, hash_bytes


@lru_cache(maxsize=None)
def tensorflow_version() -> str:
    """The installed TensorFlow's version, read from package metadata (no TF import)."""
    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def canonical_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def key_record(
    stage: str, version: int, options: dict[str, Any], inputs: dict[str, str]
) -> dict[str, Any]:
    """What a stage key hashes; kept in the store so `explain` can say what changed."""
    return {
        "scheme": SCHEME,
        "stage": stage,
        "version": version,
        "options": options,
        "inputs": inputs,
        "tensorflow": tensorflow_version(),
        "tpubuild": __version__,
    }


def stage_key(record: dict[str, Any]) -> str:
    return hash_bytes(canonical_dumps(record).encode())


def diff_records(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two key records, e.g. `option verify.rtol: 0.1 -> 0.2`."""
    changes: list[str] = []
    for field in ("scheme", "stage", "version", "tensorflow", "tpubuild"):
        if old.get(field) != new.get(field):
            changes.append(f"{field}: {old.get(field)} -> {new.get(field)}")
    _diff_values("option ", old.get("options"), new.get("options"), "", changes)
    old_in, new_in = old.get("inputs", {}), new.get("inputs", {})
    for name in sorted(set(old_in) | set(new_in)):
        if name not in old_in:
            changes.append(f"input {name}: new")
        elif name not in new_in:
            changes.append(f"input {name}: removed")
        elif old_in[name] != new_in[name]:
            changes.append(f"input {name}: content changed ({old_in[name][:12]} -> {new_in[name][:12]})")
    return changes


def _diff_values(prefix: str, old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            sub = f"{path}.{k}" if path else k
            if k not in old:
                out.append(f"{prefix}{sub}: added ({canonical_dumps(new[k])})")
            elif k not in new:
                out.append(f"{prefix}{sub}: removed (was {canonical_dumps(old[k])})")
            else:
                _diff_values(prefix, old[k], new[k], sub, out)
    elif old != new:
        out.append(f"{prefix}{path or '(all)'}: {canonical_dumps(old)} -> {canonical_dumps(new)}")
