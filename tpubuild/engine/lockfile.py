"""Lock files: `recipes/<name>.lock.yaml`, one per recipe, beside it.

They record what decided the build (recipe digest, toolchain, the hash of every input
as it was read before its stage ran, each stage's key) and what came out (each stage's
output tree, the published version), in a fixed order so diffs are readable and two
changes to two recipes never touch the same file (dvc.lock's merge conflicts).

Lines whose value may legitimately differ between machines (outputs holding measured
floats, such as verification errors, and everything keyed on them) end with MEASURED:
`.ci/run` rebuilds the example workspace on a machine that did not write the lock files
(`build --relock`) and compares them with `git diff --exit-code -I '<MEASURED>$'`.

A build rewrites a lock file only when a key it records changed (`same_keys`): a clean
checkout built on another machine stays clean, whatever that machine measured (a
verification error, a calibrated output's size). Measured figures belong in the report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tpubuild.atomic import write_text_atomic

SCHEMA = 2
HEADER = "# Written by `tpubuild build`; commit it, do not edit it.\n"
MEASURED = "# measured on the building machine"

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # PyYAML without libyaml
    _Loader = yaml.SafeLoader


def lock_document(
    recipe: str,
    digest: str,
    toolchain: dict[str, str],
    inputs: dict[str, str],
    stages: list[dict[str, Any]],
    version: int | None,
    artifact: list[tuple[str, Any, bool]] | None = None,
) -> dict[str, Any]:
    """The lock file's content; key order is the file's order. `artifact`: (field, value,
    measured) facts a reviewer reads in a diff (size, parameters, cost, error)."""
    return {
        "schema": SCHEMA,
        "recipe": recipe,
        "recipe_digest": digest,
        "toolchain": dict(toolchain),
        "inputs": dict(sorted(inputs.items())),
        "stages": [
            {"stage": s["stage"], "key": s["key"], "output": s["output"], "measured": bool(s.get("measured")),
             "key_measured": bool(s.get("key_measured")),
             **({"discovered": dict(sorted(s["discovered"].items()))} if s.get("discovered") is not None else {})}
            for s in stages
        ],
        "published_version": version,
        "artifact": [(name, value, bool(measured)) for name, value, measured in (artifact or [])],
    }


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_DIGEST = re.compile(r"[0-9a-f]{16,}")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _scalar(value: Any) -> str:
    """A YAML scalar: JSON's double-quoted strings are valid YAML, and plain hex digests stay plain."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if (_NAME.fullmatch(text) and text.lower() not in _YAML_WORDS) or (_DIGEST.fullmatch(text) and not text.isdigit()):
        return text  # a name, or a hex digest with a letter (never a YAML number), reads the same unquoted
    return json.dumps(text, ensure_ascii=False)


def lock_text(document: dict[str, Any]) -> str:
    """The file's text: a fixed layout (written by hand, not by a YAML dumper, so that
    measured values can carry their marker comment)."""
    lines = [HEADER.rstrip("\n")]
    for key in ("schema", "recipe", "recipe_digest"):
        lines.append(f"{key}: {_scalar(document[key])}")
    lines.append("toolchain:")
    lines.extend(f"  {k}: {_scalar(v)}" for k, v in document["toolchain"].items())
    lines.append("inputs:" if document["inputs"] else "inputs: {}")
    lines.extend(f"  {_scalar(k)}: {_scalar(v)}" for k, v in document["inputs"].items())
    lines.append("stages:")
    for stage in document["stages"]:
        lines.append(f"- stage: {_scalar(stage['stage'])}")
        lines.append(f"  key: {_scalar(stage['key'])}" + (f"  {MEASURED}" if stage["key_measured"] else ""))
        lines.append(f"  output: {_scalar(stage['output'])}" + (f"  {MEASURED}" if stage["measured"] else ""))
        if stage["measured"]:
            lines.append("  measured: true")
        if "discovered" in stage:  # what its user code imported, or looked for and found absent
            lines.append("  discovered:" if stage["discovered"] else "  discovered: {}")
            lines.extend(f"    {_scalar(k)}: {_scalar(v)}" for k, v in stage["discovered"].items())
    lines.append(f"published_version: {_scalar(document['published_version'])}")
    if document.get("artifact"):
        lines.append("artifact:  # what was published: a reviewer's view of the change")
        for name, value, measured in document["artifact"]:
            mark = f"  {MEASURED}" if measured else ""
            if isinstance(value, dict):
                lines.append(f"  {name}:" + mark)
                lines.extend(f"    {_scalar(k)}: {_number(v)}" + mark for k, v in value.items())
            else:
                lines.append(f"  {name}: {_number(value)}{mark}")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    if isinstance(value, float):
        return repr(float(f"{value:.4g}"))  # 4 significant digits: a review figure, not a hash
    return _scalar(value)


def read_lock(path: Path) -> dict[str, Any] | None:
    """The lock document, or None when absent, unreadable or of another schema."""
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    for stage in data.get("stages", []):
        stage.setdefault("measured", False)
        stage.setdefault("key_measured", False)
    data.setdefault("artifact", {})
    return data


def same_keys(recorded: dict[str, Any] | None, document: dict[str, Any]) -> bool:
    """True when the lock file as read (`recorded`, from read_lock) records the keys of
    `document`: the same recipe and digest, the same inputs, the same stages in the same
    order, each with the same key. A stage whose key hashes a measured output (its
    `key_measured`, known from the plan: read_lock cannot see the marker comment) is
    compared by name only, as are the outputs, the published version, the toolchain
    (every part of it that decides an output is in the keys) and the artifact's facts.
    What a stage's user code imported is in its key; a lock file that does not record it
    yet (written before it did) is rewritten, so that `build --check` can use it."""
    if recorded is None:
        return False
    if (recorded.get("recipe"), recorded.get("recipe_digest")) != (document["recipe"], document["recipe_digest"]):
        return False
    if dict(recorded.get("inputs") or {}) != document["inputs"]:
        return False
    old = recorded.get("stages") or []
    new = document["stages"]
    if [s.get("stage") for s in old] != [s["stage"] for s in new]:
        return False
    return all((n["key_measured"] or o.get("key") == n["key"]) and o.get("discovered") == n.get("discovered")
               for o, n in zip(old, new))


def write_lock(path: Path, document: dict[str, Any], force: bool = False) -> bool:
    """Write `document` atomically when a key changed (or with `force`, when any byte
    would); False, and no write, otherwise."""
    text = lock_text(document)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    if not force and same_keys(read_lock(path), document):
        return False
    write_text_atomic(path, text)
    return True
