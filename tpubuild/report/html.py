"""`tpubuild report --html`: a recipe's versions as a self-contained page of charts, and an
index of every recipe with a small trend each. TensorFlow-free.

Charts are Vega-Lite specifications made with Altair and drawn by Vega's own JavaScript
(vega, vega-lite and vega-embed as one bundle, from vl-convert-python), inlined with the
styles: the page requests nothing from any network and opens from disk. SVG renderer: the
charts print sharp. Under each chart a table holds the exact numbers (hover says them too);
the points that were never published (a failed build, a number reserved by a publish that
did not finish) are drawn in red and named in the table. Why these libraries:
docs/architecture.md ("The report page"), measured by benchmarks/report_page.py.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpubuild.report.formats import human_bytes
from tpubuild.report.history_points import STATUS

GENERATOR = "tpubuild report --html"  # the page's <meta name="generator">: what tpubuild may overwrite
WIDTH, HEIGHT = 640, 170
MARK_COLOUR = "#c0392b"  # never published
STATUS_COLOURS = {"published": "#2471a3", "pruned": "#7f8c8d", "gone": "#7f8c8d", "failed": MARK_COLOUR,
                  "not published": MARK_COLOUR, "reserved": MARK_COLOUR}
STAGE_COLOURS = {"built": "#1e8449", "cached": "#95a5a6", "failed": MARK_COLOUR, "skipped": "#d5d8dc"}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1c2833; margin: 24px auto;
       max-width: 980px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #d5d8dc; }
.meta { color: #566573; margin: 0 0 12px; }
figure { margin: 12px 0 18px; break-inside: avoid; page-break-inside: avoid; }
figcaption { font-weight: 600; margin-bottom: 4px; }
table { border-collapse: collapse; font-size: 12px; margin-top: 6px; }
th, td { border: 1px solid #d5d8dc; padding: 2px 6px; text-align: right; }
th { background: #f4f6f7; } td.t, th.t { text-align: left; }
td:nth-child(2) { white-space: nowrap; }
tr.marked td { color: #922b21; background: #fdedec; }
.note { color: #566573; font-size: 12px; }
ul.findings li { margin: 2px 0; }
.spark { display: inline-block; vertical-align: middle; }
a { color: #1f618d; }
@media print {
  body { margin: 0; max-width: none; font-size: 11px; }
  h2 { break-after: avoid; }
  a { color: inherit; text-decoration: none; }
  .vega-embed .vega-actions { display: none; }
}
"""


def javascript_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, from vl-convert-python (the bundler
    Altair's own `save(..., inline=True)` uses, utils/html.py), at the Vega-Lite version of
    Altair's schema. Computed once per process: bundling costs about two seconds (measured
    in docs/architecture.md); an index writes every page with the one bundle."""
    if not _BUNDLE:
        import altair
        import vl_convert

        wanted = altair.SCHEMA_VERSION.lstrip("v").split(".")[:2]  # "v6.4.1" -> "6.4"
        known = vl_convert.get_vegalite_versions()  # ["5.21", "6.1", "6.4", ...]
        # Altair's version when this vl-convert ships it (as Altair asks for it: "v6_4"), else its newest.
        vl_version = "v" + "_".join(wanted) if ".".join(wanted) in known else None
        _BUNDLE.append(vl_convert.javascript_bundle(vl_version=vl_version))  # type: ignore[call-arg]
    return _BUNDLE[0]


_BUNDLE: list[str] = []


def written_here(path: Path) -> bool:
    """Whether the file at `path` is a page this command wrote (its generator meta, near
    the start): what a page may replace."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048)
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR}">'.encode() in head


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "bytes":
        return f"{human_bytes(value)} ({value:,} B)"
    if kind == "seconds":  # a latency of microseconds, a stage of minutes
        if value < 1e-3:
            return f"{value * 1e6:.3g} µs"
        return f"{value * 1e3:.3g} ms" if value < 0.1 else f"{value:.3f} s"
    if kind == "share":
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def _table(head: list[str], rows: list[list[str]], marked: list[bool] | None = None) -> str:
    head = [html.escape(h) for h in head]  # column names are text (a dtype's, a target's)
    out = ["<table><tr>" + "".join(f'<th class="t">{h}</th>' if i == 0 else f"<th>{h}</th>"
                                   for i, h in enumerate(head)) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="marked"' if marked and marked[i] else ""
        out.append(f"<tr{cls}>" + "".join(f'<td class="t">{c}</td>' if j == 0 else f"<td>{c}</td>"
                                          for j, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


class Page:
    """One HTML page: figures (a chart each, its table under it) and text sections."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.specs: dict[str, dict[str, Any]] = {}

    def text(self, markup: str) -> None:
        self.parts.append(markup)

    def figure(self, fid: str, caption: str, chart: Any, table: str = "", note: str = "") -> None:
        self.specs[fid] = chart.to_dict()
        self.parts.append(f'<figure id="{fid}" class="chart"><figcaption>{html.escape(caption)}</figcaption>'
                          f'<div class="vega" id="{fid}-chart"></div>'
                          + (f'<div class="note">{note}</div>' if note else "") + table + "</figure>")

    def render(self, script: str) -> str:
        specs = json.dumps(self.specs, sort_keys=True).replace("</", "<\\/")
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta name="generator" content="{GENERATOR}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style>"
            f"<script>{script.replace('</script', '<' + chr(92) + '/script')}</script></head><body>"
            + "".join(self.parts)
            + f'<script>const SPECS = {specs};\n'
            "Promise.all(Object.entries(SPECS).map(([id, spec]) => vegaEmbed('#' + id + '-chart', spec, "
            "{renderer: 'svg', actions: false})))"
            ".then(() => { document.body.dataset.charts = 'ready'; })"
            ".catch((error) => { document.body.dataset.charts = 'error'; console.error(error); });"
            "</script></body></html>\n"
        )


def _x(alt: Any, points: list[dict[str, Any]]) -> Any:
    """The shared x axis: each point by label and build date, in build order."""
    order = [p["axis"] for p in points]
    return alt.X("axis:N", sort=order, title="version (✗: not published) and build date",
                 axis=alt.Axis(labelAngle=0, labelExpr="split(datum.label, '\\n')"))


def _marks(alt: Any, points: list[dict[str, Any]]) -> Any | None:
    """Red dashed rules at the points never published, on every chart over versions."""
    marked = [{"axis": p["axis"], "status": p["status_text"], "label": p["label"]} for p in points if p["marked"]]
    if not marked:
        return None
    return alt.Chart(alt.Data(values=marked)).mark_rule(color=MARK_COLOUR, strokeDash=[4, 3], strokeWidth=1.5).encode(
        x=_x(alt, points), tooltip=[alt.Tooltip("label:N", title="point"), alt.Tooltip("status:N")])


def _series(alt: Any, points: list[dict[str, Any]], rows: list[dict[str, Any]], y_title: str, y_format: str = "~s",
            log: bool = False) -> Any:
    """Lines and points of `rows` ({axis, series, value, status, marked}) over the versions:
    the published versions joined by a line per series; a figure a build measured and did
    not publish (a failed verification's error) a red cross of its own, on no line."""
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    y = alt.Y("value:Q", title=y_title, scale=scale, axis=alt.Axis(format=y_format, tickCount=5, labelOverlap="greedy"))
    tooltip = [alt.Tooltip("label:N", title="point"), alt.Tooltip("date:N", title="built"), alt.Tooltip("series:N"),
               alt.Tooltip("value:Q", format=",.6~g"), alt.Tooltip("status:N")]
    colour = alt.Color("series:N", title=None, legend=alt.Legend(orient="top"))
    kept = [r for r in rows if not r["marked"]]
    layers = []
    rule = _marks(alt, points)
    if rule is not None:
        layers.append(rule)
    if kept:
        base = alt.Chart(alt.Data(values=kept)).encode(x=_x(alt, points), y=y, color=colour, tooltip=tooltip)
        layers += [base.mark_line(strokeWidth=1.5), base.mark_point(filled=True, size=60, opacity=1)]
    crossed = [r for r in rows if r["marked"]]
    if crossed:
        layers.append(alt.Chart(alt.Data(values=crossed)).mark_point(shape="cross", filled=True, size=130,
                                                                    color=MARK_COLOUR, opacity=1)
                      .encode(x=_x(alt, points), y=y, tooltip=tooltip))
    if len(layers) == (1 if rule is not None else 0):  # nothing measured: the axes, no marks
        layers.append(alt.Chart(alt.Data(values=[{"axis": p["axis"]} for p in points])).mark_point(opacity=0)
                      .encode(x=_x(alt, points)))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT)


def _rows(points: list[dict[str, Any]], value: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in points:
        for series, v in value(p).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append({"axis": p["axis"], "label": p["label"], "date": p["date"] or "", "series": series,
                            "value": v, "status": p["status_text"], "marked": p["marked"]})
    return out


def _cell(field: str, key: str, kind: str = "") -> Callable[[dict[str, Any]], str]:
    """A table column of one series of a per-point dict (parameters by dtype, latency by target)."""
    return lambda p: _fmt(p[field].get(key), kind)


def _version_table(points: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict[str, Any]], str]]]) -> str:
    head = ["point", "built", "status"] + [c for c, _ in columns]
    rows = [[p["label"], html.escape((p["date"] or "–").rstrip("Z").replace("T", " ")), html.escape(p["status_text"])]
            + [f(p) for _, f in columns] for p in points]
    return _table(head, rows, [p["marked"] for p in points])


def recipe_page(recipe: str, recipe_file: str, points: list[dict[str, Any]], newest: dict[str, Any] | None,
                explanation: dict[str, Any] | None, script: str, generated: str) -> str:
    """The page of one recipe (module docstring); `newest`: the newest version's manifest,
    report and attempt; `explanation`: the newest `explain-error` result, if any."""
    import altair as alt

    page = Page(f"{recipe}: tpubuild report")
    published = [p for p in points if p["status"] == "published"]
    marked = [p for p in points if p["marked"]]
    page.text(f"<h1>{html.escape(recipe)}</h1><p class=\"meta\">{html.escape(recipe_file)} · "
              f"{len(published)} published version(s), {len(marked)} build(s) or number(s) not published · "
              f"page written {html.escape(generated)}</p>")
    if not points:
        page.text("<p>No version is published and no build is recorded: run <code>tpubuild build "
                  f"{html.escape(recipe)}</code>.</p>")
        return page.render(script)
    page.text("<h2>Versions</h2>")
    sizes = _rows(points, lambda p: {"artifact": p["size"], "source": p["source_size"]})
    page.figure("fig-size", "Artifact size", _series(alt, points, sizes, "bytes", "~s"),
                _version_table(points, [("artifact", lambda p: _fmt(p["size"], "bytes")),
                                        ("source", lambda p: _fmt(p["source_size"], "bytes"))]))
    dtypes = sorted({d for p in points for d in p["params"]})
    params = _rows(points, lambda p: {d: p["params"].get(d) for d in dtypes})
    page.figure("fig-params", "Parameters by dtype (elements)", _series(alt, points, params, "elements", "~s"),
                _version_table(points, [(d, _cell("params", d)) for d in dtypes]))
    costs = _rows(points, lambda p: {"total": p["cost_total"], "TPU": p["cost_tpu"], "CPU": p["cost_cpu"]})
    page.figure("fig-cost", "Cost (static model, FLOPs)", _series(alt, points, costs, "cost", "~s"),
                _version_table(points, [("total", lambda p: _fmt(p["cost_total"])),
                                        ("TPU", lambda p: _fmt(p["cost_tpu"])), ("CPU", lambda p: _fmt(p["cost_cpu"]))]))
    errors = _rows(points, lambda p: {"max abs error": p["max_abs_error"] or None})
    page.figure("fig-error", "Verification: max abs error (log scale)",
                _series(alt, points, errors, "max abs error", ".1e", log=True),
                _version_table(points, [("max abs error", lambda p: _fmt(p["max_abs_error"])),
                                        ("verified", lambda p: {True: "passed", False: "FAILED", None: "–"}[p["verified"]])]),
                note="A failed verification is not published: its measured error is the red cross.")
    agreement = _rows(points, lambda p: {"argmax agreement": p["argmax_agreement"]})
    page.figure("fig-argmax", "Verification: argmax agreement (worst output)",
                _series(alt, points, agreement, "agreement", ".0%"),
                _version_table(points, [("argmax agreement", lambda p: _fmt(p["argmax_agreement"], "share"))]),
                note="" if agreement else "No output of this recipe is a classifier's: nothing to agree on.")
    targets = sorted({t for p in points for t in p["latency"]})
    if targets:
        latency = _rows(points, lambda p: {t: p["latency"].get(t) for t in targets})
        page.figure("fig-latency", "Measured latency per call (slowest signature; each target and its source, "
                    "measured side by side)",
                    _series(alt, points, latency, "seconds (log scale)", "~s", log=True),
                    _version_table(points, [(t, _cell("latency", t, "seconds")) for t in targets]))
    _newest(alt, page, points, newest)
    if explanation:
        _drift(alt, page, points, explanation, newest)
    return page.render(script)


def _newest(alt: Any, page: Page, points: list[dict[str, Any]], newest: dict[str, Any] | None) -> None:
    latest = [p for p in points if p["version"] is not None and p["status"] == "published"]
    page.text("<h2>The newest version</h2>")
    if not latest:
        page.text("<p>None is published.</p>")
        return
    point = latest[-1]
    attempt = point.get("attempt") or {}
    page.text(f"<p class=\"meta\">version {point['version']}, built {html.escape(point['date'] or '–')}"
              + (f", git {html.escape(str(point.get('git_commit'))[:12])}" if point.get("git_commit") else "") + "</p>")
    later = [p for p in points if p["seq"] > point["seq"] and p["marked"]]
    if later:
        page.text(f"<p class=\"note\">Since then: {len(later)} build(s) published nothing, the last "
                  f"{html.escape(later[-1]['status_text'])}: {html.escape(str(later[-1].get('error') or ''))}</p>")
    stages = attempt.get("stages") or []
    if stages:
        rows = [{"stage": s["stage"], "seconds": s.get("seconds") or 0.0, "status": s["status"],
                 "key": (s.get("key") or "")[:16], "startup": s.get("worker_startup_seconds")} for s in stages]
        chart = alt.Chart(alt.Data(values=rows)).mark_bar().encode(
            y=alt.Y("stage:N", sort=[r["stage"] for r in rows], title=None),
            x=alt.X("seconds:Q", title="seconds (its own work; cached: the lookup)"),
            color=alt.Color("status:N", scale=alt.Scale(domain=list(STAGE_COLOURS), range=list(STAGE_COLOURS.values())),
                            legend=alt.Legend(orient="top", title=None)),
            tooltip=["stage:N", "status:N", alt.Tooltip("seconds:Q", format=".3f"),
                     alt.Tooltip("startup:Q", title="worker start-up s", format=".3f"), "key:N"],
        ).properties(width=WIDTH, height=max(60, 22 * len(rows)))
        table = _table(["stage", "status", "seconds", "worker start-up", "key"],
                       [[html.escape(str(r["stage"])), html.escape(str(r["status"])), f"{r['seconds']:.3f}",
                         _fmt(r["startup"], "seconds"), html.escape(str(r["key"]))]
                        for r in rows])
        page.figure("fig-stages", f"Stage times of the build that published version {point['version']}", chart, table)
    else:
        page.text("<p class=\"note\">Its stage times are not recorded (published before this workspace kept a "
                  "build history).</p>")
    findings = _findings(attempt, (newest or {}).get("report_json") or {})
    page.text("<h3>Findings</h3>" + ("<ul class=\"findings\">" + "".join(f"<li>{html.escape(f)}</li>" for f in findings)
                                     + "</ul>" if findings else "<p class=\"note\">None.</p>"))


def _findings(attempt: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """Every stage's warnings (the build's record of them), else the report's stage findings."""
    found = [f"{stage}: {w}" for stage, warnings in sorted((attempt.get("warnings") or {}).items()) for w in warnings]
    if not found:
        found = [f"{stage}: {w}" for stage, summary in sorted((report.get("stages") or {}).items())
                 for w in summary.get("warnings", [])]
    minimum = report.get("min_tensorflow")
    if minimum:
        found.append(f"oldest TensorFlow that loads it: {minimum['version']} ({minimum['reason']})")
    return found


def _explained_point(points: list[dict[str, Any]], stage: Any, key: Any) -> dict[str, Any] | None:
    """The point whose build the explanation is about: the one whose `stage` had `key`."""
    for point in reversed(points):
        stages = (point.get("attempt") or {}).get("stages") or []
        if any(isinstance(s, dict) and s.get("stage") == stage and s.get("key") == key for s in stages):
            return point
    return None


def _drift(alt: Any, page: Page, points: list[dict[str, Any]], explanation: dict[str, Any],
           newest: dict[str, Any] | None) -> None:
    stage, key = explanation.get("stage"), explanation.get("stage_key")
    keys = {s.get("stage"): s.get("key") for s in ((newest or {}).get("manifest") or {}).get("stages", [])
            if isinstance(s, dict)}
    point = _explained_point(points, stage, key)
    if keys.get(stage) == key:
        about = "of the newest version's build"
    elif point is not None:
        about = f"of the build {point['label']} ({point['status_text']}), not the newest version's"
    else:
        about = "of a build that is not the newest version's (its stage key differs)"
    tolerance = explanation.get("tolerance") or {}
    rows: list[dict[str, Any]] = []
    for signature, nodes in sorted((explanation.get("nodes") or {}).items()):
        # bfloat16: each signature's tensors in graph order; quantize (""): the int8 layers, worst first.
        for rank, n in enumerate(nodes if isinstance(nodes, list) else []):
            if not isinstance(n, dict) or not isinstance(n.get("max_rel_error"), (int, float)):
                continue
            order = n.get("order") if signature and isinstance(n.get("order"), int) else rank
            rows.append({"order": order, "node": str(n.get("node")), "op": str(n.get("op")),
                         "dtype": str(n.get("dtype")), "signature": signature or "int8 layers",
                         "error": float(n["max_rel_error"]), "abs": n.get("max_abs_error"),
                         "within": "within" if n.get("within") else "out of tolerance"})
    page.text("<h2>Where the error starts (explain-error)</h2>"
              f"<p class=\"meta\">stage {html.escape(str(stage))}, {html.escape(about)}; run "
              f"{html.escape(str(explanation.get('created', '')))}; tolerance rtol {html.escape(str(tolerance.get('rtol')))}, "
              f"atol {html.escape(str(tolerance.get('atol')))}"
              + (f"; proposal: <code>{html.escape(str(explanation['proposal']))}</code>" if explanation.get("proposal") else "")
              + "</p>")
    if not rows:
        page.text("<p class=\"note\">No compared op has a finite error.</p>")
        return
    rows.sort(key=lambda r: (r["signature"], r["order"]))
    several = len({r["signature"] for r in rows}) > 1
    seen: dict[str, int] = {}
    for r in rows:
        r["plotted"] = max(r["error"], 1e-9)  # a log axis has no 0: an exact op sits at its floor
        where = f"{r['signature']}: {r['node']}" if several else r["node"]
        seen[where] = seen.get(where, 0) + 1  # one place on the axis per compared tensor
        r["where"] = where if seen[where] == 1 else f"{where} ({seen[where]})"
    x = alt.X("where:N", sort=[r["where"] for r in rows], title="op, in graph order" if stage == "bfloat16"
              else "int8 layer, worst first", axis=alt.Axis(labelAngle=-40, labelOverlap="greedy", labelLimit=160))
    y = alt.Y("plotted:Q", scale=alt.Scale(type="log"), title="max rel error",
              axis=alt.Axis(format=".0e", tickCount=5, labelOverlap="greedy"))
    tooltip = ["node:N", "op:N", "dtype:N", "signature:N", alt.Tooltip("error:Q", title="max rel error", format=".4g"),
               alt.Tooltip("abs:Q", title="max abs error", format=".4g"), "within:N"]
    base = alt.Chart(alt.Data(values=rows)).encode(x=x, y=y, tooltip=tooltip)
    line = base.mark_line(color="#aab7b8", strokeWidth=1).encode(detail="signature:N")
    dots = base.mark_point(filled=True, size=60, opacity=1).encode(
        color=alt.Color("within:N", scale=alt.Scale(domain=["within", "out of tolerance"],
                                                    range=["#2471a3", MARK_COLOUR]),
                        legend=alt.Legend(orient="top", title=None)),
        **({"shape": alt.Shape("signature:N", legend=alt.Legend(orient="top"))} if several else {}))
    tolerance_line = []
    rtol = tolerance.get("rtol")
    if isinstance(rtol, (int, float)) and rtol > 0:
        tolerance_line = [alt.Chart(alt.Data(values=[{"rtol": rtol}])).mark_rule(strokeDash=[2, 2], color="#566573")
                          .encode(y="rtol:Q")]
    chart = alt.layer(line, dots, *tolerance_line).properties(width=WIDTH, height=HEIGHT + 40)
    worst = sorted(rows, key=lambda r: -r["error"])[:12]
    table = _table(["node", "op", "dtype", "signature", "max rel error", "max abs error", "tolerance"],
                   [[html.escape(r["node"]), html.escape(r["op"]), html.escape(r["dtype"]), html.escape(r["signature"]),
                     f"{r['error']:.4g}", _fmt(r["abs"]), r["within"]] for r in worst])
    shown = "All the ops compared" if len(rows) <= 12 else f"The 12 largest errors of {len(rows)} ops compared"
    page.figure("fig-drift", "Op-level error drift (dashed: verify's rtol)", chart,
                f"<p class=\"note\">{shown}:</p>" + table)


def index_page(entries: list[dict[str, Any]], script: str, generated: str) -> str:
    """Every recipe, linked to its page, with a small trend of its artifact size."""
    import altair as alt

    page = Page("tpubuild report: every recipe")
    page.text(f"<h1>Recipes</h1><p class=\"meta\">{len(entries)} recipe(s) · page written {html.escape(generated)}</p>")
    rows = []
    for i, entry in enumerate(entries):
        pts = entry["points"]
        newest = next((p for p in reversed(pts) if p["status"] == "published"), None)
        last = pts[-1] if pts else None
        fid = f"spark-{i}"
        values = [{"x": p["seq"], "size": p["size"], "label": p["label"], "status": p["status_text"],
                   "marked": p["marked"]} for p in pts if p["size"] is not None]
        if values:
            spark = alt.Chart(alt.Data(values=values)).mark_line(point=True).encode(
                x=alt.X("x:Q", axis=None), y=alt.Y("size:Q", axis=None, scale=alt.Scale(zero=False)),
                tooltip=["label:N", alt.Tooltip("size:Q", format=",", title="bytes"), "status:N"],
            ).properties(width=160, height=28).configure_view(stroke=None)
            page.specs[fid] = spark.to_dict()
        sizes = [v["size"] for v in values]
        # The trend's y axis spans what was measured, not from 0: its range said beside it.
        spread = f' <span class="note">{human_bytes(min(sizes))} – {human_bytes(max(sizes))}</span>' if values else ""
        trend = f'<div class="vega spark" id="{fid}-chart"></div>{spread}' if values else "–"
        rows.append([f'<a href="{html.escape(entry["href"])}">{html.escape(entry["recipe"])}</a>',
                     f"v{newest['version']}" if newest else "none",
                     _fmt(newest["size"], "bytes") if newest else "–",
                     _fmt(newest["max_abs_error"]) if newest else "–",
                     html.escape(last["status_text"]) if last else "never built", trend])
    page.text(_table(["recipe", "newest", "artifact size", "max abs error", "last build", "artifact size over versions"],
                     rows, [bool(e["points"]) and e["points"][-1]["marked"] for e in entries]))
    page.text(f"<p class=\"note\">Red rows: the recipe's last build published nothing ({html.escape(STATUS['failed'])}).</p>")
    return page.render(script)
