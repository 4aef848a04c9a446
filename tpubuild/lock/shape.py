"""Lock files a build did not write as they are: malformed (a hand edit, a bad merge) or stale
beside what the cache and the output directory hold. `build --check` names the problem
(engine/lockcheck.py), the next build rewrites the file (engine/lockdoc.py write_run_lock).

Keys alone do not cover a lock file: `same_keys` compares the keys and stage names, so a
second `stages:` list (PyYAML keeps the last of two equal keys, where YAML says keys are
unique), an unknown field or an output digest no build made for that key would pass
`--check` and survive every build. (A `published_version` line is an older tpubuild's
layout, lockfile.older_layout: not malformed, and rewritten by the next build.)
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Callable

# The fields lockfile.lock_document writes, at the top and in each stage.
FIELDS = frozenset({"schema", "recipe", "recipe_digest", "toolchain", "planning", "inputs", "stages",
                    "published_version", "artifact"})
STAGE_FIELDS = frozenset({"stage", "key", "output", "measured", "key_measured", "discovered", "peak_memory"})


def defect(text: str, display: str, stages: Collection[str] | None = None) -> str | None:
    """What makes the lock file `text` (named `display`) one no build wrote, as
    `file:line:col: what`: YAML with a key given twice, a field lock_text does not write,
    a stage listed twice or, given every stage tpubuild has (`stages`: pipeline.STAGE_ORDER),
    one that is none of them. None when there is none: its keys and outputs are `build
    --check`'s to compare. A stage tpubuild has that the recipe no longer runs is no defect:
    the file records the build before the recipe was edited (stale, not malformed)."""
    from tpubuild.config.yamlload import load_yaml
    from tpubuild.errors import ConfigError

    try:
        data, marks = load_yaml(text, display)  # the recipe loader's: a duplicate key is an error
    except ConfigError as exc:
        return exc.lines()[0]
    if not isinstance(data, dict):
        return f"{display}: not a mapping"
    for name in sorted(set(data) - FIELDS, key=str):
        return f"{marks.key((name,))}: unknown field {name!r}"
    listed = data.get("stages")
    if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        return f"{marks.value(('stages',))}: stages: not a list of stages"
    seen: set[Any] = set()
    for index, stage in enumerate(listed):
        name = stage.get("stage")
        for field in sorted(set(stage) - STAGE_FIELDS, key=str):
            return f"{marks.key(('stages', index, field))}: stage {name}: unknown field {field!r}"
        if name in seen:
            return f"{marks.value(('stages', index))}: stage {name} is listed twice"
        if stages is not None and name not in stages:
            return f"{marks.value(('stages', index))}: {name!r} is not a stage tpubuild has"
        seen.add(name)
    return None


def well_formed(document: dict[str, Any], stages: Collection[str]) -> bool:
    """Whether a lock document as read (lockfile.read_lock_keys) has only what a build
    writes, `stages` being every stage tpubuild has: the test before `defect` parses the
    text to say where it does not (a key given twice makes read_lock_keys return None)."""
    listed = document.get("stages")
    if set(document) - FIELDS or not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        return False
    names = [s.get("stage") for s in listed]
    return (all(set(s) <= STAGE_FIELDS for s in listed) and len(set(names)) == len(names)
            and set(names) <= set(stages))


def stale_output(stage: str, recorded: Any, made: str) -> str:
    """The words for a lock file whose `stage` records output `recorded` under a key whose
    output is `made` (in the cache, or by the build)."""
    return f"stage {stage}: it records output {str(recorded)[:12]} for its key, which made {made[:12]} (a stale lock file)"


def stale_outputs(recorded: dict[str, Any], document: dict[str, Any]) -> list[str]:
    """stale_output's words for each stage whose key `recorded` (a lock file as read) holds
    with another output than the build's `document`. A measured output differs between
    machines: not compared."""
    old = {s.get("stage"): s for s in recorded.get("stages") or [] if isinstance(s, dict)}
    return [stale_output(s["stage"], old[s["stage"]].get("output"), s["output"]) for s in document["stages"]
            if not s.get("measured") and s["stage"] in old and old[s["stage"]].get("key") == s["key"]
            and old[s["stage"]].get("output") != s["output"]]


def rewrite_reason(path: Path, display: Callable[[Path], str], document: dict[str, Any],
                   stages: Collection[str]) -> str | None:
    """Why the build must rewrite the lock file at `path` (paths named by `display`) although it may
    record the build's keys (lockfile.same_keys): malformed (`stages`: every stage tpubuild
    has), or an output its key did not make. None when neither (or when it is the build's,
    byte for byte, or absent: written anyway)."""
    from tpubuild.lock.lockfile import lock_text, parse_lock_keys

    try:
        text = path.read_text()
    except OSError:
        return None
    if text == lock_text(document):
        return None
    problem = defect(text, display(path), stages)
    if problem is not None:
        return f"malformed: {problem}"
    recorded = parse_lock_keys(text) or {}
    stale = stale_outputs(recorded, document)
    return stale[0] if stale else None
