"""Stage keys: a full-length hash of everything that can change a stage's output.

A key record holds the stage's name, the digest of its own code (keys/code.py), the
toolchain (Python, TensorFlow, numpy, protobuf versions), the allow-listed environment
variables that change TensorFlow's behaviour, the stage's option slice, and the digests
of exactly the inputs it reads (workspace files, consumed earlier outputs and summaries).
Workers get a scrubbed environment (`worker_env`), so nothing outside the record can
reach a stage through the environment.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from tpubuild.digests import SCHEME, hash_bytes, key_env, toolchain

RECORD_SCHEMA = 2


def canonical_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def key_record(
    stage: str, code: str, options: dict[str, Any], inputs: dict[str, str],
    environ: Mapping[str, str] | None = os.environ,
) -> dict[str, Any]:
    """What a stage key hashes; kept in the store so `explain` can say what changed.
    `environ=None` for the engine's own copy step, which no toolchain or variable changes."""
    return {
        "schema": RECORD_SCHEMA,
        "scheme": SCHEME,
        "stage": stage,
        "code": code,
        "toolchain": toolchain() if environ is not None else {},
        "env": key_env(environ) if environ is not None else {},
        "options": options,
        "inputs": dict(sorted(inputs.items())),
    }


def stage_key(record: dict[str, Any]) -> str:
    return hash_bytes(canonical_dumps(record).encode())


def summary_digest(summary: dict[str, Any], warnings: list[str]) -> str:
    """What a later stage that reads a summary hashes of it."""
    return hash_bytes(canonical_dumps({"summary": summary, "warnings": warnings}).encode())


def diff_records(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two key records, e.g. `option verify.rtol: 0.1 -> 0.2`."""
    changes: list[str] = []
    for field in ("schema", "scheme", "stage"):
        if old.get(field) != new.get(field):
            changes.append(f"{field}: {old.get(field)} -> {new.get(field)}")
    if old.get("code") != new.get("code"):
        changes.append("the stage's code changed (tpubuild was edited or upgraded)")
    _diff_values("toolchain ", old.get("toolchain"), new.get("toolchain"), "", changes)
    _diff_values("environment variable ", old.get("env", {}), new.get("env", {}), "", changes)
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


def _of_containers(value: Any) -> bool:
    """A non-empty list of mappings or lists; a list of scalars reads better whole ([2, 4, 8])."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, (dict, list)) for v in value)


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
    elif _of_containers(old) and _of_containers(new):
        # Lists of mappings (batch_options, tpu_functions) item by item, as `tpubuild diff`
        # prints them: `batch_options[0].batch_timeout_micros: 2000 -> 3000`, not both lists.
        for i in range(max(len(old), len(new))):
            sub = f"{path}[{i}]"
            if i >= len(old):
                out.append(f"{prefix}{sub}: added ({canonical_dumps(new[i])})")
            elif i >= len(new):
                out.append(f"{prefix}{sub}: removed (was {canonical_dumps(old[i])})")
            else:
                _diff_values(prefix, old[i], new[i], sub, out)
    elif old != new:
        out.append(f"{prefix}{path or '(all)'}: {canonical_dumps(old)} -> {canonical_dumps(new)}")
