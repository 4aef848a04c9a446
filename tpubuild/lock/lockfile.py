"""Lock files: `recipes/<name>.lock.yaml`, one per recipe, beside it.

They record what decided the build (recipe digest, toolchain, the hash of every input
as it was read before its stage ran, each stage's key, and for a stage that runs user
code what that code imported, `discovered`) and what came out (each stage's output
tree, the published version), in a fixed order so diffs are readable and two
changes to two recipes never touch the same file (dvc.lock's merge conflicts).

Lines whose value may legitimately differ between machines (outputs holding measured
floats, such as verification errors, and everything keyed on them; each stage's
`peak_memory`, its worker's peak resident set in bytes when it was built, and the build's
among the artifact's facts) end with MEASURED:
`.ci/run` rebuilds the example workspace on a machine that did not write the lock files
(`build --relock`) and compares them with `git diff --exit-code -I '<MEASURED>$'`.

A build rewrites a lock file only when a key it records changed (`same_keys`), or when no
build wrote it as it is (lock/shape.py: malformed, an output its key did not make):
a clean checkout built on another machine stays clean, whatever that machine measured (a
verification error, a calibrated output's size). Measured figures belong in the report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tpubuild.atomic import write_text_atomic

SCHEMA = 2
HEADER = "# Written by `tpubuild build`; commit it, do not edit it.\n"
MEASURED = "# measured on the building machine"

# Not compared by same_keys (a build never rewrites a lock file for it alone): a stale one
# only sends `build --check` down its full path, which computes every key.
PLANNING_COMMENT = ("# tpubuild's code, the workspace file, the key variables, the recipe's files: "
                    "while they hash the same, build --check trusts the keys below")


def lock_document(
    recipe: str,
    digest: str,
    toolchain: dict[str, str],
    inputs: dict[str, str],
    stages: list[dict[str, Any]],
    artifact: list[tuple[str, Any, bool]] | None = None,
    planning: str | None = None,
) -> dict[str, Any]:
    """The lock file's content; key order is the file's order. `artifact`: (field, value,
    measured) facts a reviewer reads in a diff (size, parameters, cost, error)."""
    return {
        "schema": SCHEMA,
        "recipe": recipe,
        "recipe_digest": digest,
        "toolchain": dict(toolchain),
        "planning": planning,
        "inputs": dict(sorted(inputs.items())),
        "stages": [
            {"stage": s["stage"], "key": s["key"], "output": s["output"], "measured": bool(s.get("measured")),
             "key_measured": bool(s.get("key_measured")),
             **({"discovered": dict(sorted(s["discovered"].items()))} if s.get("discovered") else {}),
             **({"peak_memory": s["peak_memory"]} if s.get("peak_memory") is not None else {})}
            for s in stages
        ],
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
    if document.get("planning"):
        lines.append(f"planning: {document['planning']}  {PLANNING_COMMENT}")
    lines.append("inputs:" if document["inputs"] else "inputs: {}")
    lines.extend(f"  {_scalar(k)}: {_scalar(v)}" for k, v in document["inputs"].items())
    lines.append("stages:")
    for stage in document["stages"]:
        lines.append(f"- stage: {_scalar(stage['stage'])}")
        lines.append(f"  key: {_scalar(stage['key'])}" + (f"  {MEASURED}" if stage["key_measured"] else ""))
        lines.append(f"  output: {_scalar(stage['output'])}" + (f"  {MEASURED}" if stage["measured"] else ""))
        if stage["measured"]:
            lines.append("  measured: true")
        if stage.get("discovered"):  # what its user code imported or looked for and found absent; packages it used
            lines.append("  discovered:  # what its code imported or used, and where an import looked and found nothing")
            lines.extend(f"    {_scalar(k)}: {_scalar(v)}" for k, v in stage["discovered"].items())
        if stage.get("peak_memory") is not None:  # bytes: its worker's peak resident set when it was built
            lines.append(f"  peak_memory: {_scalar(stage['peak_memory'])}  {MEASURED}")
    lines.append("artifact:  # what was published: a reviewer's view of the change")
    if document.get("artifact"):
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
        return parse_lock(path.read_text())
    except OSError:
        return None


def parse_lock(text: str) -> dict[str, Any] | None:
    """The lock document in `text` (a lock file already read), or None when it is not one
    of this schema."""
    # Only for a layout lock_text does not write: `build --check` reads the others without
    # YAML. The recipes' loader: a key given twice (a second `stages:` from a bad merge) makes
    # the file unreadable, not the last one silently read (lock/shape.py says where).
    from tpubuild.config.yamlload import load_yaml
    from tpubuild.errors import ConfigError

    try:
        data, _ = load_yaml(text, "lock file")
    except (ConfigError, ValueError):
        return None
    return _with_defaults(data)


def read_lock_keys(path: Path) -> dict[str, Any] | None:
    """What `same_keys` reads of the lock file (all but the artifact's facts), or None as
    read_lock. The layout `lock_text` writes is read line by line, 4x faster than the YAML
    parser (`build --check` reads every lock file); any other layout, hand-edited or
    merged, is read by read_lock. Read line by line, a stage whose key line carries the
    MEASURED marker also has `key_measured` true (a comment the YAML parser drops)."""
    try:
        return parse_lock_keys(path.read_text())
    except OSError:
        return None


def parse_lock_keys(text: str) -> dict[str, Any] | None:
    """read_lock_keys of a lock file's text already read."""
    try:
        return _with_defaults(_parse_layout(text))
    except _OtherLayout:
        return parse_lock(text)


def _with_defaults(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    for stage in data.get("stages", []):
        stage.setdefault("measured", False)
        stage.setdefault("key_measured", False)
    if data.get("artifact") is None:
        data["artifact"] = {}
    return data


class _OtherLayout(Exception):
    pass


_PLAIN: dict[str, Any] = {"null": None, "true": True, "false": False, "{}": {}}
_INT = re.compile(r"-?[0-9]+")
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
# One line of the layout `lock_text` writes: indentation, a list dash, the key (a name or a
# JSON string), and a value (a JSON string or a plain word) or none, then maybe a comment.
_LINE = re.compile(rf'( *)(- )?(?:([A-Za-z_][A-Za-z0-9_-]*)|({_JSON_STRING})):(?: ({_JSON_STRING}|[^ ]+))?(?:  (#.*))?')


def _word(word: str) -> Any:
    """The value of a plain word `_scalar` wrote; _OtherLayout for anything else."""
    if len(word) >= 16 and not word.strip("0123456789abcdef") and not word.isdigit():
        return word  # a digest, most of a lock file's words: what the tests below would say, sooner
    if word in _PLAIN:
        return {} if word == "{}" else _PLAIN[word]
    if _INT.fullmatch(word):
        return int(word)
    if _NAME.fullmatch(word) and word.lower() not in _YAML_WORDS or _DIGEST.fullmatch(word):
        return word
    raise _OtherLayout  # a float, or YAML syntax `lock_text` never writes


def _string(quoted: str) -> str:
    try:
        return json.loads(quoted)
    except ValueError:
        raise _OtherLayout from None


def _parse_layout(text: str) -> dict[str, Any]:
    """The document `lock_text` wrote, up to its `artifact:` section; _OtherLayout otherwise
    (a key given twice too: parse_lock refuses it)."""
    doc: dict[str, Any] = {}
    section: Any = None  # the mapping or list the indented lines fill
    inner: dict[str, Any] | None = None  # a stage's `discovered`
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise _OtherLayout
        spaces, dash, name, quoted_key, raw, comment = match.groups()
        indent = len(spaces)
        key = name if name is not None else _string(quoted_key)
        has_value = raw is not None
        value = None if raw is None else _string(raw) if raw.startswith('"') else _word(raw)
        if indent == 0 and not dash:
            if key in doc:
                raise _OtherLayout
            if key in ("toolchain", "inputs", "stages") and not has_value:
                section = doc[key] = [] if key == "stages" else {}
                continue
            if key == "artifact" and not has_value:
                # The artifact's facts follow: a reviewer's, no key among them; a field after
                # them is not lock_text's (lock/shape.py names it).
                if any(rest[:1] not in ("", " ", "#") for rest in lines[number + 1:]):
                    raise _OtherLayout
                return doc
            doc[key] = value
            section = None
        elif isinstance(section, dict) and indent == 2 and not dash and has_value and key not in section:
            section[key] = value
        elif isinstance(section, list) and indent == 0 and dash and has_value:
            section.append({key: value})
            inner = None
        elif isinstance(section, list) and section and indent == 2 and not dash and key not in section[-1]:
            section[-1][key] = value if has_value else {}
            inner = None if has_value else section[-1][key]
            if key == "key" and comment == MEASURED:
                section[-1]["key_measured"] = True  # the marker lock_text writes; the YAML parser drops it
        elif inner is not None and indent == 4 and not dash and has_value and key not in inner:
            inner[key] = value
        else:
            raise _OtherLayout
    raise _OtherLayout  # cut short


def same_keys(recorded: dict[str, Any] | None, document: dict[str, Any]) -> bool:
    """True when the lock file as read (`recorded`, from read_lock) records the keys of
    `document`: the same recipe and digest, the same inputs, the same stages in the same
    order, each with the same key. A stage whose key hashes a measured output (its
    `key_measured`, known from the plan: read_lock cannot see the marker comment) is
    compared by name only, as are the outputs, the toolchain (every part of it that
    decides an output is in the keys) and the artifact's facts. What a stage's user code
    imported is in its key; a lock file that does not record it yet (written before it
    did) is rewritten, so that `build --check` can use it, as is one of the older layout."""
    if recorded is None or older_layout(recorded):
        return False
    if (recorded.get("recipe"), recorded.get("recipe_digest")) != (document["recipe"], document["recipe_digest"]):
        return False
    if dict(recorded.get("inputs") or {}) != document["inputs"]:
        return False
    old = recorded.get("stages") or []
    new = document["stages"]
    if [s.get("stage") for s in old] != [s["stage"] for s in new]:
        return False
    return all((n["key_measured"] or o.get("key") == n["key"])
               and (o.get("discovered") or {}) == (n.get("discovered") or {}) for o, n in zip(old, new))


def older_layout(recorded: dict[str, Any]) -> bool:
    """Whether a lock file as read records what lock files no longer do: the number of the
    version published locally (`published_version`, which made a revert leave the file
    modified). The next build rewrites it, and `build --check` says so."""
    return "published_version" in recorded


def write_lock(path: Path, document: dict[str, Any], force: bool = False, history: Path | None = None) -> bool:
    """Write `document` atomically when a key changed (or with `force`, when any byte
    would); False, and no write, otherwise. With `history` (a file of the workspace's
    state), the text a write replaces is remembered there, and a document whose keys an
    earlier text records is written as that text (`recall`)."""
    text = lock_text(document)
    try:
        current = path.read_text()
    except OSError:
        current = None
    if current == text:
        return False
    if not force and current is not None and same_keys(parse_lock_keys(current), document):
        return False
    if history is not None:
        earlier = None if force else recall(history, document)
        if current is not None:
            remember(history, current)
        text = earlier if earlier is not None else text
    write_text_atomic(path, text)
    return True


# Texts a lock file's history keeps (newest first): enough for a change, its revert and a
# few builds between them.
HISTORY_LENGTH = 16


def recall(history: Path, document: dict[str, Any]) -> str | None:
    """The newest earlier text of the lock file that records the keys of `document`.
    A build keeps a lock file whose keys match, whatever this machine measured
    (`same_keys`): the file committed from another machine, changed by a build and then
    reverted, is written back as it was, byte for byte, not with this machine's figures."""
    for text in _history(history):
        if same_keys(parse_lock_keys(text), document):
            return text
    return None


def remember(history: Path, text: str) -> None:
    """Keep `text`, a lock file's content a build is about to replace, in its history."""
    texts = [text] + [t for t in _history(history) if t != text]
    try:
        history.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(history, json.dumps(texts[:HISTORY_LENGTH]))
    except OSError:
        pass  # only a memory: without it a revert writes this machine's measured figures


def _history(history: Path) -> list[str]:
    try:
        texts = json.loads(history.read_text())
    except (OSError, ValueError):
        return []
    return [t for t in texts if isinstance(t, str)] if isinstance(texts, list) else []
