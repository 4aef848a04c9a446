"""The report page's charting library: Altair (Vega-Lite, vl-convert's bundle of Vega's
JavaScript inlined: what `tpubuild report --html` uses) beside Plotly (its bundled
plotly.min.js inlined), each drawing the same six charts of the same 20 versions.

Prints per library, each measured in fresh processes of this run: the page's bytes, the
time to write one page (import, script, specs: the command's own start-up cost), the time
of a second page in the same process (an index's further pages), and the installed size
of the library's distributions. Reference in the same run: `python -c pass`.
Asserts nothing. Plotly is the bench extra's (`pip install -e '.[bench]'`), or another
interpreter that has it: `--plotly-python /path/to/python`.

Run: python3 benchmarks/report_page.py [--repeat 3] [--plotly-python PYTHON]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS = 20

# The points of a recipe of VERSIONS versions, as report/history_points.py makes them.
MAKE_POINTS = f"""
from tpubuild.report.history_points import points
versions = {{}}
for n in range(1, {VERSIONS} + 1):
    versions[n] = {{"recipe": "bench", "created": f"2026-01-{{n:02d}}T10:00:00Z",
        "report": {{"size": {{"artifact": 1000000 + 5000 * n, "source": 2000000}},
                    "cost": {{"total": 9e9 + n * 1e7, "tpu": 8e9, "cpu": 1e9 + n * 1e7}},
                    "max_abs_error": 1e-3 * (1 + n % 4), "argmax_agreement": 1 - 0.001 * (n % 3),
                    "parameters": {{"bfloat16": 400000 + n, "float32": 1000}}}},
        "targets": {{"litert": {{"verify": {{"latency": {{"call_seconds": {{"litert": 0.002 + n * 1e-5, "source": 0.003}}}}}}}}}}}}
pts = points(versions, [])
"""

ALTAIR = MAKE_POINTS + """
from tpubuild.report import html
page = html.recipe_page("bench", "recipes/bench.yaml", pts, None, None, html.javascript_bundle(), "now")
"""

PLOTLY = MAKE_POINTS + """
import plotly.graph_objects as go
import plotly.io as pio
x = [p["axis"].replace("\\n", "<br>") for p in pts]
def fig(series):
    f = go.Figure([go.Scatter(x=x, y=[s(p) for p in pts], mode="lines+markers", name=name) for name, s in series])
    f.update_layout(width=640, height=220, margin=dict(l=40, r=10, t=10, b=40))
    return f
figures = [
    fig([("artifact", lambda p: p["size"]), ("source", lambda p: p["source_size"])]),
    fig([("bfloat16", lambda p: p["params"].get("bfloat16")), ("float32", lambda p: p["params"].get("float32"))]),
    fig([("total", lambda p: p["cost_total"]), ("TPU", lambda p: p["cost_tpu"]), ("CPU", lambda p: p["cost_cpu"])]),
    fig([("max abs error", lambda p: p["max_abs_error"])]),
    fig([("argmax", lambda p: p["argmax_agreement"])]),
    fig([("litert", lambda p: p["latency"].get("litert"))]),
]
divs = [pio.to_html(f, full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
page = "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(divs) + "</body></html>"
"""

# Run in a fresh process: one page (timed from the interpreter's start), then a second.
TIMED = """
import json, sys, time
t0 = time.perf_counter()
exec(compile(sys.argv[1], "page", "exec"))
first = time.perf_counter() - t0
t1 = time.perf_counter()
exec(compile(sys.argv[1], "page", "exec"))
second = time.perf_counter() - t1
print(json.dumps({"first": first, "second": second, "bytes": len(page.encode()),
                  "tensorflow": "tensorflow" in sys.modules}))
"""

SIZES = """
import json, sys
from importlib import metadata
total = 0
for name in sys.argv[1:]:
    dist = metadata.distribution(name)
    total += sum(f.size or 0 for f in dist.files or [])
print(json.dumps(total))
"""


def run(python: str, code: str, repeat: int) -> dict:
    results = []
    for _ in range(repeat):
        started = time.perf_counter()
        out = subprocess.run([python, "-c", TIMED, code], cwd=REPO, capture_output=True, text=True,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        wall = time.perf_counter() - started
        if out.returncode != 0:
            raise SystemExit(f"{python}: {out.stderr.strip().splitlines()[-1]}")
        result = json.loads(out.stdout)
        result["wall"] = wall
        results.append(result)
    return {k: statistics.median(r[k] for r in results) if k != "tensorflow" else any(r[k] for r in results)
            for k in results[0]}


def installed(python: str, names: list[str]) -> int:
    out = subprocess.run([python, "-c", SIZES, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plotly-python", default=sys.executable,
                        help="an interpreter with plotly installed (default: this one)")
    args = parser.parse_args()
    reference = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        reference.append(time.perf_counter() - started)
    print(f"reference: python -c pass {statistics.median(reference):.3f} s")
    rows = [("altair + vl-convert", sys.executable, ALTAIR, ["altair", "vl-convert-python", "narwhals", "jinja2"])]
    has_plotly = subprocess.run([args.plotly_python, "-c", "import plotly"], capture_output=True).returncode == 0
    if has_plotly:
        rows.append(("plotly", args.plotly_python, PLOTLY, ["plotly", "narwhals"]))
    else:
        print("plotly: not installed here (pip install -e '.[bench]', or --plotly-python)")
    for label, python, code, dists in rows:
        r = run(python, code, args.repeat)
        print(f"{label:20s} page {r['bytes'] / 1e6:.2f} MB, first page {r['first']:.2f} s "
              f"(process {r['wall']:.2f} s), next page {r['second']:.3f} s, installed "
              f"{installed(python, dists) / 1e6:.0f} MB, tensorflow imported: {r['tensorflow']}")


if __name__ == "__main__":
    main()
