"""A recipe's history as points to chart: one per published version (its figures from its
manifest), one per build that published nothing (a failed verification keeps the errors it
measured), one per version that is gone (pruned: its figures from the history) and one per
number reserved but never published (a publish that did not finish). Chronological; each
point names itself on the x axis by version number and build date. TensorFlow-free.

Inputs are what `tpubuild report --html` read (commands/report_html.py): `versions`
(number -> manifest), `attempts` (engine/history.py's records, oldest first) and `reserved`,
the highest number ever reserved (publish/versions.py). All of it is data others could
have written: a figure of the wrong type is no figure.

A number no version and no record holds is either pruned (below the oldest version kept:
`keep_versions` removes the oldest) or reserved and never published (above it: a publish
killed, or a version deleted by hand); only the second is marked.
"""

from __future__ import annotations

from typing import Any

# A point's status -> what the page says of it; the ones not published are marked.
STATUS = {
    "published": "published",
    "pruned": "published, since pruned (keep_versions)",
    "gone": "pruned before its figures were recorded",
    "failed": "build failed: not published",
    "not published": "built, not published",
    "reserved": "number reserved, never published (the publish did not finish)",
}
MARKED = ("failed", "not published", "reserved")


def _short_date(iso: str | None) -> str:
    return "" if not iso else iso[5:16].replace("T", " ")  # "12-02 14:05"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _slowest(value: Any) -> float | int | None:
    """A latency figure: one number, or per signature (the slowest)."""
    if isinstance(value, dict):
        found = [v for v in map(_number, value.values()) if v is not None]
        return max(found, default=None)
    return _number(value)


def _figures(report: Any, manifest: Any = None) -> dict[str, Any]:
    """The plotted figures of a report summary (stages/report.py `_summary`, the manifest's
    "report") and of the manifest's targets (each target's measured latency per call)."""
    report = _dict(report)
    cost, size = _dict(report.get("cost")), _dict(report.get("size"))
    latency = {}
    for target, entry in sorted(_dict(_dict(manifest).get("targets")).items()):
        call = _dict(_dict(_dict(entry).get("verify")).get("latency")).get("call_seconds")
        if isinstance(call, dict):  # report/targets.py: {target: seconds, "source": seconds}
            latency[target] = _slowest(call.get(target))
            latency[f"{target} (source)"] = _slowest(call.get("source"))
    params = {str(k): v for k, v in _dict(report.get("parameters")).items() if _number(v) is not None}
    return {"size": _number(size.get("artifact")), "source_size": _number(size.get("source")),
            "cost_total": _number(cost.get("total")), "cost_tpu": _number(cost.get("tpu")),
            "cost_cpu": _number(cost.get("cpu")), "max_abs_error": _number(report.get("max_abs_error")),
            "argmax_agreement": _number(report.get("argmax_agreement")), "params": params,
            "latency": {k: v for k, v in latency.items() if v is not None}}


def _failed_verify(figures: Any) -> dict[str, Any]:
    """What a failed verification measured (stages/verify.py's verify.json)."""
    verify = _dict(figures)
    outputs = verify["outputs"] if isinstance(verify.get("outputs"), list) else []
    agreements = [a for a in (_number(_dict(o).get("argmax_agreement")) for o in outputs) if a is not None]
    return {"max_abs_error": _number(verify.get("max_abs_error")), "argmax_agreement": min(agreements, default=None),
            "verified": False}


def _blank(number: int | None, status: str, date: Any = None, attempt: Any = None) -> dict[str, Any]:
    return {"version": number, "status": status, "date": date if isinstance(date, str) else None,
            **_figures({}), "verified": None, "git_commit": None, "attempt": attempt}


def points(versions: dict[int, dict[str, Any]], attempts: list[dict[str, Any]],
           reserved: int | None = None) -> list[dict[str, Any]]:
    """Every point of the recipe's charts, chronological (module docstring)."""
    published_by: dict[int, dict[str, Any]] = {}
    for a in attempts:
        if a.get("outcome") in ("published", "updated", "unchanged") and isinstance(a.get("version"), int):
            published_by[a["version"]] = a  # the newest build that published or updated it
    numbered: dict[int, dict[str, Any]] = {}
    for number, manifest in versions.items():
        report = _dict(manifest.get("report"))
        numbered[number] = {**_blank(number, "published", manifest.get("created"), published_by.get(number)),
                            **_figures(report, manifest),
                            # A published version passed verify (a failure publishes nothing).
                            "verified": True if _number(report.get("max_abs_error")) is not None else None,
                            "git_commit": manifest.get("git_commit") if isinstance(manifest.get("git_commit"), str)
                            else None}
    for number, a in published_by.items():
        if number not in numbered:
            numbered[number] = {**_blank(number, "pruned", a.get("finished"), a), **_figures(a.get("report"))}
    oldest = min(versions, default=None)
    highest = max([*numbered, *([reserved] if reserved else [])], default=0)
    for number in range(1, highest + 1):
        if number not in numbered:
            gone = oldest is not None and number < oldest
            numbered[number] = _blank(number, "gone" if gone else "reserved")
    ordered = [numbered[n] for n in sorted(numbered)]
    # Builds that published nothing, each after the last point built before it.
    for a in attempts:
        if a.get("outcome") not in ("failed", "not published"):
            continue
        point = {**_blank(None, a["outcome"], a.get("finished"), a), **_figures(a.get("report")),
                 "failed_stage": a.get("failed_stage") if isinstance(a.get("failed_stage"), str) else None,
                 "error": a.get("error") if isinstance(a.get("error"), str) else None}
        failed = _dict(a.get("failed_figures"))
        if "verify" in failed:
            point.update(_failed_verify(failed["verify"]))
        at = len(ordered)  # after the last point built before it (an undated number tells no time)
        while at > 0 and (ordered[at - 1]["date"] is None or ordered[at - 1]["date"] > (point["date"] or "")):
            at -= 1
        ordered.insert(at, point)
    unnumbered = 0
    for seq, point in enumerate(ordered):
        point["seq"] = seq
        if point["version"] is not None:
            point["label"] = f"v{point['version']}"
        else:
            unnumbered += 1
            point["label"] = f"✗{unnumbered}"
        point["axis"] = f"{point['label']}\n{_short_date(point['date'])}"
        point["marked"] = point["status"] in MARKED
        point["status_text"] = STATUS[point["status"]] + (
            f" (stage {point['failed_stage']} failed)" if point.get("failed_stage") else "")
    return ordered
