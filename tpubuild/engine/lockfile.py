"""Lock files: `recipes/<name>.lock.yaml`, one per recipe, beside it.

They record what decided the build (recipe digest, input hashes, stage keys) and what
came out (output hash, published version), in a fixed order so diffs are readable and
two changes to two recipes never touch the same file (dvc.lock's merge conflicts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tpubuild.atomic import write_text_atomic

SCHEMA = 1
HEADER = "# Written by `tpubuild build`; commit it, do not edit it.\n"

try:
    _Loader: Any = yaml.CSafeLoader
    _Dumper: Any = yaml.CSafeDumper
except AttributeError:  # PyYAML without libyaml
    _Loader, _Dumper = yaml.SafeLoader, yaml.SafeDumper


def lock_document(
    recipe: str,
    digest: str,
    tensorflow: str,
    tpubuild: str,
    inputs: dict[str, str],
    stages: list[dict[str, Any]],
    output: str,
    version: int | None,
) -> dict[str, Any]:
    """The lock file's content; key order is the file's order (never sorted by YAML)."""
    return {
        "schema": SCHEMA,
        "recipe": recipe,
        "recipe_digest": digest,
        "tensorflow": tensorflow,
        "tpubuild": tpubuild,
        "inputs": dict(sorted(inputs.items())),
        "stages": [
            {"stage": s["stage"], "version": s["version"], "key": s["key"], "output": s["output"]} for s in stages
        ],
        "output": output,
        "published_version": version,
    }


def dumps(document: dict[str, Any]) -> str:
    return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def read_lock(path: Path) -> dict[str, Any] | None:
    """The lock document, or None when absent, unreadable or of another schema."""
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    return data


def write_lock(path: Path, document: dict[str, Any]) -> bool:
    """Write `document` atomically; False (and no write) when the file already says it."""
    text = dumps(document)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    write_text_atomic(path, text)
    return True
