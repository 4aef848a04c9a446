"""The serving targets of a published version side by side (TensorFlow-free).

Read from the version's manifest (publish/targets.py): the report stage runs before the
target chains, so `tpubuild-report.json` knows only the TPU SavedModel; each target's
size, verification and latency are in `tpubuild-manifest.json` under `targets`.
"""

from __future__ import annotations

from typing import Any

from tpubuild.report.formats import human_bytes

COLUMNS = ("target", "directory", "size", "max abs error", "verified", "call (target / source)",
           "load (target / source)")


def rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: the TPU SavedModel (from the report summary), then each other."""
    report = manifest.get("report") or {}
    number = manifest.get("version")
    out = [{
        "target": "tpu_savedmodel",
        "directory": f"{number}/",
        "size": (report.get("size") or {}).get("artifact"),
        "max_abs_error": report.get("max_abs_error"),
        "passed": None if report.get("max_abs_error") is None else True,  # a failed verify publishes nothing
        "call_seconds": None,  # runs on a TPU only; verify ran its CPU twin
        "load_seconds": None,
    }]
    for target, entry in sorted((manifest.get("targets") or {}).items()):
        verify = entry.get("verify") or {}
        latency = verify.get("latency") or {}
        out.append({
            "target": target,
            "directory": f"{target}/{number}/",
            "size": verify.get("size"),
            "max_abs_error": verify.get("max_abs_error"),
            "passed": verify.get("passed"),
            "call_seconds": latency.get("call_seconds"),
            "load_seconds": latency.get("load_seconds"),
            "method": latency.get("method"),
            "details": details(target, verify),
        })
    return out


def details(target: str, verify: dict[str, Any]) -> list[str]:
    """What a target's table row cannot hold: a LiteRT flatbuffer's ops and which composites
    fused (litert_verify's summary), an XLA AOT target's libraries."""
    lines = []
    if verify.get("ops"):
        ops = verify["ops"]
        listed = ", ".join(f"{name} {count}" for name, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"{sum(ops.values())} ops: {listed}")
    composites = verify.get("composites") or []
    if composites:
        lines.append("composites: " + ", ".join(map(_composite, composites)))
    for library in verify.get("libraries") or []:  # xla_aot_verify
        name = library.get("cpp_class") or library.get("class")
        if name:
            lines.append(f"library {name}")
    return lines


def _composite(composite: dict[str, Any]) -> str:
    if composite.get("fused"):
        return f"{composite['name']} -> {composite['fused_op']}"
    return f"{composite['name']} not fused" + ("" if composite.get("kept") else " (not kept)")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e6:.0f} us" if value < 1e-3 else f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def _pair(figures: Any, target: str) -> str:
    """`target / source` of a {side: seconds} or {side: {signature: seconds}} mapping."""
    if not figures:
        return "-"
    def one(side: str) -> str:
        value = figures.get(side)
        if isinstance(value, dict):  # per signature: the slowest
            value = max(value.values(), default=None)
        return _seconds(value)
    return f"{one(target)} / {one('source')}"


def cells(row: dict[str, Any]) -> list[str]:
    error = row["max_abs_error"]
    return [row["target"], row["directory"], "-" if row["size"] is None else human_bytes(row["size"]),
            "-" if error is None else f"{error:.4g}", {True: "passed", False: "FAILED", None: "-"}[row["passed"]],
            _pair(row["call_seconds"], row["target"]), _pair(row["load_seconds"], row["target"])]


def methods(table: list[dict[str, Any]]) -> list[str]:
    return sorted({row["method"] for row in table if row.get("method")})


def to_text(table: list[dict[str, Any]]) -> str:
    grid = [list(COLUMNS)] + [cells(row) for row in table]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["Targets:"] + ["  " + "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in grid]
    lines += [f"  {row['target']}: {line}" for row in table for line in row.get("details", [])]
    lines += [f"  Latency: {m}" for m in methods(table)]
    return "\n".join(lines) + "\n"


def to_markdown(table: list[dict[str, Any]]) -> str:
    out = ["", "## Targets", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(cells(row)) + " |" for row in table]
    out += [""] + [f"- {row['target']}: {line}" for row in table for line in row.get("details", [])]
    out += [""] + [f"Latency: {m}." for m in methods(table)]
    return "\n".join(out) + "\n"
