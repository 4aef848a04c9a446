"""The conversion report as text, Markdown and JSON, and the difference of two reports.

TensorFlow-free: `tpubuild report` renders published reports without loading a model.
"""

from __future__ import annotations

import json
from typing import Any

REPORT_SCHEMA = 1
REPORT_JSON = "tpubuild-report.json"
REPORT_MD = "tpubuild-report.md"


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def percent(part: float, total: float) -> str:
    return f"{100 * part / total:.2f}%" if total else "0.00%"


def cost_lines(cost: dict[str, Any]) -> list[str]:
    """The converter's lines: TPU and CPU shares of the model, then each TPU function's cost."""
    total = cost["total"]
    lines = [
        f"TPU cost of the model: {percent(cost['tpu'], total)} ({cost['tpu']}/{total})",
        f"CPU cost of the model: {percent(cost['cpu'], total)} ({cost['cpu']}/{total})",
    ]
    for row in cost["tpu_functions"]:
        label = row["alias"] or row["function"]
        lines.append(f"  TPU function {label}: {row['cost']} ({percent(row['cost'], total)})")
    return lines


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parameter_bytes(table: dict[str, dict[str, int]]) -> int:
    return sum(row["bytes"] for row in table.values())


def ratio(new: float, old: float) -> str:
    return f"{new / old:.3f}" if old else "n/a"


def _size_lines(report: dict[str, Any]) -> list[str]:
    src, art = report["size"]["source"], report["size"]["artifact"]
    p_src, p_art = parameter_bytes(report["parameters"]["source"]), parameter_bytes(report["parameters"]["artifact"])
    lines = [
        f"Size: artifact {human_bytes(art['total'])} (graph {human_bytes(art['graph'])}, variables "
        f"{human_bytes(art['variables'])}); source {human_bytes(src['total'])} (graph "
        f"{human_bytes(src['graph'])}, variables {human_bytes(src['variables'])}); ratio {ratio(art['total'], src['total'])}",
        f"Parameters: artifact {human_bytes(p_art)}, source {human_bytes(p_src)}; ratio {ratio(p_art, p_src)}",
    ]
    for dtype in sorted(set(report["parameters"]["source"]) | set(report["parameters"]["artifact"])):
        s = report["parameters"]["source"].get(dtype, {"elements": 0, "bytes": 0})
        a = report["parameters"]["artifact"].get(dtype, {"elements": 0, "bytes": 0})
        lines.append(
            f"  {dtype}: {a['elements']} elements ({human_bytes(a['bytes'])}) in the artifact, "
            f"{s['elements']} ({human_bytes(s['bytes'])}) in the source"
        )
    return lines


def _verify_lines(verify: dict[str, Any] | None) -> list[str]:
    if not verify:
        return ["Verification: not run"]
    tol = verify["tolerance"]
    lines = [
        f"Verification: {'passed' if verify['passed'] else 'FAILED'} ({tol['kind']} tolerances: "
        f"rtol {tol['rtol']:g}, atol {tol['atol']:g}); max abs error {verify['max_abs_error']:.4g}, "
        f"max rel error {verify['max_rel_error']:.4g}"
    ]
    for out in verify["outputs"]:
        line = (
            f"  {out['signature']}/{out['output']}: max abs {out['max_abs_error']:.4g}, "
            f"max rel {out['max_rel_error']:.4g}, {out['mismatched']}/{out['elements']} outside"
        )
        if out["argmax_agreement"] is not None:
            line += f", argmax agreement {out['argmax_agreement']:.1%}"
        lines.append(line)
    return lines + [f"  {line}" for line in inputs_lines(verify)]


INPUTS = {"representative_dataset": "the representative dataset", "random": "seeded random inputs",
          "mixed": "the representative dataset where a signature has one, else seeded random inputs"}


def inputs_lines(verify: dict[str, Any]) -> list[str]:
    """Which inputs the verdict used, and the error on the other kind (random inputs)."""
    on = verify.get("verdict_on")
    if on is None:  # a report written before verify recorded it
        return []
    lines = [f"Verdict on {INPUTS[on]}."]
    random_inputs = verify.get("random_inputs")
    if random_inputs and "skipped" in random_inputs:
        lines.append(f"On random inputs: not measured ({random_inputs['skipped']}).")
    elif random_inputs:
        within = "within" if random_inputs["within_tolerance"] else "outside"
        lines.append(f"On seeded random inputs (not part of the verdict): max abs error "
                     f"{random_inputs['max_abs_error']:.4g}, max rel error {random_inputs['max_rel_error']:.4g}, "
                     f"{within} the same tolerances.")
    elif on == "random":
        lines.append("No representative dataset: the error on realistic inputs is unknown.")
    return lines + headroom_lines(verify)


# From this share of its bound on, a passing lossy conversion is reported as close to failing.
CLOSE_TO_TOLERANCE = 0.5


def headroom_lines(verify: dict[str, Any]) -> list[str]:
    """A line when a bfloat16 or int8 verification passed with little room: the worst
    output's error as a share of its bound (atol + rtol * max|output|), and where to look."""
    tol = verify["tolerance"]
    if tol["kind"] == "exact" or not verify["passed"]:
        return []
    shares = [o["max_abs_error"] / (tol["atol"] + tol["rtol"] * o["max_reference"])
              for o in verify["outputs"] if o.get("max_reference") is not None and
              tol["atol"] + tol["rtol"] * o["max_reference"] > 0]
    share = max(shares, default=0.0)
    if share < CLOSE_TO_TOLERANCE:
        return []
    return [f"Close to the tolerance: the worst output's error is {share:.0%} of its bound; "
            "`tpubuild explain-error` names the ops where the error starts."]


def _quantization_lines(quant: dict[str, Any] | None) -> list[str]:
    if not quant:
        return []
    layers = ", ".join(f"{op} {v['quantized']}/{v['total']}" for op, v in sorted(quant["layers"].items()))
    int8 = quant.get("parameters", {}).get("int8", {}).get("elements", 0)
    return [
        f"Quantization: {quant['method']} (op set {quant['op_set']}); quantized layers: {layers or 'not reported by TF'}; "
        f"{int8} int8 weight elements"
    ]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def bfloat16_line(summary: dict[str, Any]) -> str:
    """What computes in bfloat16 and what stays float32, as the rewrite recorded it: ops
    are counted when their dtype changed, a jax2tf XlaCallModule when its StableHLO did."""
    converted = summary.get("converted_ops", {})
    line = (f"bfloat16 (scope {summary.get('scope')}): {len(summary.get('variables', []))} variable(s), "
            f"ops converted: {_counts(converted) or 'none'}")
    if not converted:
        line += " (nothing computes in bfloat16)"
    kept_tf = summary.get("kept_float32", {})
    kept = [f"{op} {n} ({why})" for key, why in (("filterlist", "filterlist"), ("no_bfloat16_cpu_kernel", "no bfloat16 CPU kernel"))
            for op, n in sorted(kept_tf.get(key, {}).items())]
    for module in summary.get("xla_call_modules", []):
        where = f"XlaCallModule {module['node']} in {module['function']}"
        if module.get("converted_ops"):
            line += f"; {where} computes in bfloat16: {_counts(module['converted_ops'])}"
        for op, k in sorted(module.get("kept_float32", {}).items()):
            what = f"all of {where}" if op == "module" else f"{op} {k['count']} in {where}"
            kept.append(f"{what} ({k['reason']})")
    return line + (f"; kept float32: {', '.join(kept)}" if kept else "")


def _stage_line(name: str, summary: dict[str, Any]) -> str:
    """One line per earlier stage: the few facts a reviewer looks for."""
    if name == "batch":
        opts = summary.get("options", {})
        return (f"Batching: {summary.get('mode')}, {len(summary.get('sites', []))} batched call site(s), "
                f"max_batch_size {opts.get('max_batch_size')}, allowed_batch_sizes {opts.get('allowed_batch_sizes')}")
    if name == "bfloat16":
        return bfloat16_line(summary)
    if name == "io_shape":
        changed = sum(len(f.get("inputs", [])) + len(f.get("outputs", [])) for f in summary.get("functions", []))
        return f"IO shape: {changed} TPU input/output(s) reshaped in {len(summary.get('functions', []))} function(s)"
    if name == "reshard":
        return (f"Checkpoint: {summary.get('before')} -> {summary.get('shards')} data file(s) of at most "
                f"{summary.get('max_shard_size')} bytes (largest {summary.get('largest_shard')})")
    if name == "dataset":
        counts = ", ".join(f"{k}: {v['samples']} from {v['source']}" for k, v in sorted(summary.get("datasets", {}).items()))
        return f"Representative datasets: {counts}"
    return f"{name}: " + ", ".join(sorted(summary))


def _stage_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for row in report["stages"].get("tpu", {}).get("placed", []):
        sites = len(row.get("call_sites", []))
        line = f"TPU placement: {row.get('alias') or row['function']} at {sites} call site(s)"
        if "soft_placement" in row:  # ConverterOptionsV2's enable_soft_device_placement
            host = row["soft_placement"].get("host_ops", [])
            listed = ", ".join(f"{op['node']} ({op['op']})" for op in host)
            line += f"; soft device placement: {len(host)} op(s) run on the host instead of the TPU" + \
                (f": {listed}" if listed else "")
        lines.append(line)
    for name, summary in sorted(report["stages"].items()):
        if name != "tpu":
            lines.append(_stage_line(name, summary))
    for name, summary in sorted(report["stages"].items()):
        lines += [f"Finding ({name}): {w}" for w in summary.get("warnings", [])]
    return lines


def _hlo_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for label, entry in sorted(report["hlo"].items()):
        lines.append(f"HLO of {label}: {entry.get('file') or 'unavailable: ' + entry['error']}")
    return lines


def _title(report: dict[str, Any], prefix: str) -> str:
    """The published report is shared by every recipe with the same build: it names no
    recipe; `tpubuild report` adds the name from the recipe it was asked about."""
    return prefix + report["recipe"] if report.get("recipe") else "Conversion report"


def _compat_lines(report: dict[str, Any]) -> list[str]:
    found = report.get("min_tensorflow")
    if not found:
        return []
    return [f"Oldest TensorFlow that loads it: {found['version']} ({found['reason']})"]


def to_text(report: dict[str, Any]) -> str:
    lines = [_title(report, "Conversion report for "), *cost_lines(report["cost"])]
    lines += _compat_lines(report) + _size_lines(report) + _verify_lines(report["verify"]) + _quantization_lines(report["quantization"])
    lines += _stage_lines(report) + _hlo_lines(report)
    return "\n".join(lines) + "\n"


def to_markdown(report: dict[str, Any]) -> str:
    cost = report["cost"]
    out = ["# " + _title(report, "Conversion report: "), "", "## Compute cost", "", "```", *cost_lines(cost), "```", ""]
    out += [f"Unit: {cost['unit']} (static model from op types and shapes).", ""]
    out += [*_compat_lines(report), ""] if _compat_lines(report) else []
    out += ["## Size", "", "| | source | artifact | ratio |", "|---|---:|---:|---:|"]
    for key in ("graph", "variables", "total"):
        s, a = report["size"]["source"][key], report["size"]["artifact"][key]
        out.append(f"| {key} | {human_bytes(s)} | {human_bytes(a)} | {ratio(a, s)} |")
    out += ["", "## Parameters by dtype", "", "| dtype | source elements | source bytes | artifact elements | artifact bytes |",
            "|---|---:|---:|---:|---:|"]
    src, art = report["parameters"]["source"], report["parameters"]["artifact"]
    for dtype in sorted(set(src) | set(art)):
        s, a = src.get(dtype, {"elements": 0, "bytes": 0}), art.get(dtype, {"elements": 0, "bytes": 0})
        out.append(f"| {dtype} | {s['elements']} | {human_bytes(s['bytes'])} | {a['elements']} | {human_bytes(a['bytes'])} |")
    p_src, p_art = parameter_bytes(src), parameter_bytes(art)
    out.append(f"| **all** | | {human_bytes(p_src)} | | {human_bytes(p_art)} (ratio {ratio(p_art, p_src)}) |")
    out += ["", "## Verification", ""]
    verify = report["verify"]
    if verify:
        tol = verify["tolerance"]
        out += [f"{'Passed' if verify['passed'] else '**Failed**'} with {tol['kind']} tolerances "
                f"(rtol {tol['rtol']:g}, atol {tol['atol']:g}).", "",
                "| signature | output | max abs error | max rel error | outside | argmax agreement |",
                "|---|---|---:|---:|---:|---:|"]
        for o in verify["outputs"]:
            agree = "" if o["argmax_agreement"] is None else f"{o['argmax_agreement']:.1%}"
            out.append(f"| {o['signature']} | {o['output']} | {o['max_abs_error']:.4g} | {o['max_rel_error']:.4g} "
                       f"| {o['mismatched']}/{o['elements']} | {agree} |")
        inputs = inputs_lines(verify)
        if inputs:
            out += ["", *inputs]
    else:
        out.append("Not run.")
    if report["quantization"]:
        out += ["", "## Quantization", "", *_quantization_lines(report["quantization"])]
        if report["quantization"].get("text"):
            out += ["", "```", *report["quantization"]["text"], "```"]
    checks = _stage_lines(report)
    if checks:
        out += ["", "## Checks and stages", "", *[f"- {line}" for line in checks]]
    if report["hlo"]:
        out += ["", "## HLO of the TPU functions", ""]
        for label, entry in sorted(report["hlo"].items()):
            out.append(f"- {label}: " + (f"[{entry['file']}]({entry['file']})" if "file" in entry else f"unavailable ({entry['error']})"))
    return "\n".join(out) + "\n"


def difference(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What changed between two reports: size, cost split, parameter bytes, verification error."""

    def pair(a: Any, b: Any) -> dict[str, Any]:
        return {"old": a, "new": b}

    def tpu_share(report: dict[str, Any]) -> float:
        return report["cost"]["tpu"] / report["cost"]["total"] if report["cost"]["total"] else 0.0

    def error(report: dict[str, Any]) -> float | None:
        return (report.get("verify") or {}).get("max_abs_error")

    return {
        "size": pair(old["size"]["artifact"]["total"], new["size"]["artifact"]["total"]),
        "parameter_bytes": pair(parameter_bytes(old["parameters"]["artifact"]), parameter_bytes(new["parameters"]["artifact"])),
        "cost_total": pair(old["cost"]["total"], new["cost"]["total"]),
        "tpu_share": pair(tpu_share(old), tpu_share(new)),
        "max_abs_error": pair(error(old), error(new)),
    }


def difference_text(diff: dict[str, Any], old_label: str, new_label: str) -> str:
    def fmt(key: str, value: Any) -> str:
        if value is None:
            return "n/a"
        if key in ("size", "parameter_bytes"):
            return human_bytes(value)
        if key == "tpu_share":
            return f"{100 * value:.2f}%"
        if key == "max_abs_error":
            return f"{value:.4g}"
        return str(value)

    lines = [f"{'':16} {old_label:>14} {new_label:>14}  change"]
    for key, values in diff.items():
        old, new = values["old"], values["new"]
        change = ""
        if isinstance(old, (int, float)) and isinstance(new, (int, float)):
            change = f"{new - old:+.2%}".replace("%", " pts") if key == "tpu_share" else (
                f"x{new / old:.3f}" if old else "")
        lines.append(f"{key:16} {fmt(key, old):>14} {fmt(key, new):>14}  {change}".rstrip())
    return "\n".join(lines) + "\n"
