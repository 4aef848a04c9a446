"""The Trace Event Format's rules, as Perfetto's JSON importer and chrome://tracing apply them,
checked on a trace `build --profile` wrote (the format: the Catapult project's "Trace Event
Format" document; Perfetto's importer: src/trace_processor/importers/json/).

- The document is an object with a `traceEvents` list (the "JSON Object Format").
- A complete event (`ph: "X"`) has a `name`, a `ts` and a `dur` in microseconds (numbers,
  non-negative), an integer `pid` and `tid`, and `args` an object.
- A metadata event (`ph: "M"`) is `process_name`/`thread_name` (args.name a string) or
  `process_sort_index`/`thread_sort_index` (args.sort_index an integer).
- Complete events on one track (pid, tid) nest: sorted by start (longer first), each starts
  and ends inside the one still open around it, or after it ended. Perfetto counts any
  other as "misnested" and drops it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

META = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
        "thread_sort_index": "sort_index"}


def problems(document: Any) -> list[str]:
    """Every rule `document` breaks, one line each (none: a valid trace)."""
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    found = []
    named_tracks, named_processes = set(), set()
    complete: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for i, event in enumerate(document["traceEvents"]):
        where = f"event {i} ({event.get('name') if isinstance(event, dict) else event!r})"
        if not isinstance(event, dict):
            found.append(f"{where}: not an object")
            continue
        if not (isinstance(event.get("pid"), int) and isinstance(event.get("tid"), int)):
            found.append(f"{where}: pid and tid must be integers")
            continue
        if event.get("ph") == "M":
            field = META.get(event.get("name"))
            value = (event.get("args") or {}).get(field) if field else None
            if field is None or not isinstance(value, str if field == "name" else int):
                found.append(f"{where}: a metadata event of no known kind, or without its args.{field}")
            elif event["name"] == "thread_name":
                named_tracks.add((event["pid"], event["tid"]))
            elif event["name"] == "process_name":
                named_processes.add(event["pid"])
        elif event.get("ph") == "X":
            if not isinstance(event.get("name"), str) or not event["name"]:
                found.append(f"{where}: no name")
            for field in ("ts", "dur"):
                if not isinstance(event.get(field), (int, float)) or event[field] < 0:
                    found.append(f"{where}: {field} must be a number >= 0")
            if not isinstance(event.get("args", {}), dict):
                found.append(f"{where}: args must be an object")
            if all(isinstance(event.get(f), (int, float)) for f in ("ts", "dur")):
                complete.setdefault((event["pid"], event["tid"]), []).append(event)
        else:
            found.append(f"{where}: phase {event.get('ph')!r} is not one this trace uses (X, M)")
    for (pid, tid), events in sorted(complete.items()):
        if (pid, tid) not in named_tracks:
            found.append(f"track {pid}/{tid}: no thread_name")
        if pid not in named_processes:
            found.append(f"process {pid}: no process_name")
        open_ends: list[tuple[float, str]] = []
        for event in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            start, end = event["ts"], event["ts"] + event["dur"]
            # Perfetto reads microseconds into whole nanoseconds: within a nanosecond is equal.
            while open_ends and open_ends[-1][0] <= start + 1e-3:
                open_ends.pop()
            if open_ends and end > open_ends[-1][0] + 1e-3:
                found.append(f"track {pid}/{tid}: {event['name']!r} [{start}, {end}] straddles the end of "
                             f"{open_ends[-1][1]!r} ({open_ends[-1][0]})")
            open_ends.append((end, event["name"]))
    return found


def read_trace(path: Path) -> dict[str, Any]:
    """The trace at `path`, asserted valid."""
    document = json.loads(Path(path).read_text())
    assert problems(document) == []
    return document


def complete_events(document: dict[str, Any], cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def track_names(document: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def process_names(document: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in document["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}
