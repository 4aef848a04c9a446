"""`tpubuild report --html` (issue 56 items 1, 4, 5): a recipe built three times with changes
between (the third fails verification), its page and the workspace's index written by the
real CLI and rendered in real headless Chromium (tests/browser.py): no console error, no
request but the page itself, a chart drawn per figure, every version and the failed build
in the DOM after the scripts ran, screenshots that are not blank, on screen and printed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.browser import Browser, ink
from tests.cli import tpubuild

# One worker runs this module (--dist loadgroup): its workspace is built three times once.
pytestmark = pytest.mark.xdist_group("report_html_page")

RECIPE = """
name: dense
model: {{saved_model: ../models/dense}}
converter:
  quantization_options: {{method: {method}}}
verify: {{samples: 8{tolerance}}}
targets:
  tpu_savedmodel: {{}}
  cpu_savedmodel: {{}}
"""
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}

# What the page's DOM holds once its scripts ran: each figure, the SVG Vega drew in it and
# the marks inside (points, lines, bars, rules), and the rows of the table under it.
PROBE = """({
  charts: document.body.dataset.charts,
  figures: [...document.querySelectorAll('figure.chart')].map(f => ({
    id: f.id,
    svgs: f.querySelectorAll('.vega svg').length,
    marks: f.querySelectorAll('.vega svg path, .vega svg line').length,
    rows: [...f.querySelectorAll('table tr')].slice(1).map(r => ({
      point: r.cells[0].textContent, marked: r.classList.contains('marked'),
      cells: [...r.cells].map(c => c.textContent)}))})),
  links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  sparks: document.querySelectorAll('.spark svg').length,
  text: document.body.innerText,
  external: [...document.querySelectorAll('script[src], link[href], img[src], iframe')].length,
})"""
READY = "document.body.dataset.charts"


def write_recipe(root: Path, method: str, tolerance: str = "") -> None:
    (root / "recipes" / "dense.yaml").write_text(textwrap.dedent(RECIPE.format(method=method, tolerance=tolerance)))


@pytest.fixture(scope="module")
def built(dense: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`dense` built WEIGHT_ONLY (version 1), DYNAMIC_RANGE (2), then with a tolerance it
    cannot meet (verification fails: nothing published); `never_built` never built."""
    root = tmp_path_factory.mktemp("ws")
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\noutput_dir: out\ncache_dir: .tpubuild/cache\n")
    shutil.copytree(dense, root / "models" / "dense")
    (root / "recipes").mkdir()
    (root / "recipes" / "never_built.yaml").write_text("model: {saved_model: ../models/dense}\n")
    for method, tolerance, code in (("WEIGHT_ONLY", "", 0), ("DYNAMIC_RANGE", "", 0),
                                    ("DYNAMIC_RANGE", ", rtol: 1.0e-9, atol: 1.0e-9", 1)):
        write_recipe(root, method, tolerance)
        tpubuild(root, "build", "dense", env=QUIET, code=code)
    return root


@pytest.fixture(scope="module")
def pages(built: Path) -> Path:
    """The workspace's pages: report/dense.html, report/never_built.html, report/index.html."""
    tpubuild(built, "report", "--html", "report", env=QUIET, code=0)
    return built / "report"


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def test_the_recipe_page_draws_every_version_and_marks_the_failed_build(pages: Path, browser: Browser,
                                                                       tmp_path: Path) -> None:
    page = pages / "dense.html"
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the page refers to the network"
    seen = browser.render(page, READY, PROBE)
    (tmp_path / "dense.png").write_bytes(seen.screenshot)  # kept in the test's tmp dir for a look
    assert seen.console_errors == []
    assert seen.requests == [page.resolve().as_uri()]  # nothing but the page itself
    assert seen.dom["charts"] == "ready" and seen.dom["external"] == 0
    figures = {f["id"]: f for f in seen.dom["figures"]}
    assert set(figures) == {"fig-size", "fig-params", "fig-cost", "fig-error", "fig-argmax", "fig-latency",
                            "fig-stages"}
    for figure in figures.values():  # a chart per figure, with marks drawn in it
        assert figure["svgs"] == 1 and figure["marks"] > 0, figure
    # Every point over versions, in build order: the two versions, then the failed build, marked.
    for fid in ("fig-size", "fig-params", "fig-cost", "fig-error", "fig-argmax", "fig-latency"):
        assert [(r["point"], r["marked"]) for r in figures[fid]["rows"]] == [("v1", False), ("v2", False),
                                                                           ("✗1", True)], fid
    failed = figures["fig-error"]["rows"][2]["cells"]
    assert "build failed: not published (stage verify failed)" in failed
    assert "FAILED" in failed and float(failed[3]) > 0  # the error it measured, drawn and tabled
    assert [r["cells"][3:] for r in figures["fig-params"]["rows"][:2]] == [["128", "9,472"]] * 2  # float32, int8
    sizes = [r["cells"][3] for r in figures["fig-size"]["rows"]]
    assert sizes[0] != sizes[1] and sizes[2] == "–"  # weight-only and dynamic-range artifacts differ
    latency = figures["fig-latency"]["rows"]
    assert all(c.endswith("s") for c in latency[0]["cells"][3:]), latency  # measured per target
    stages = {r["point"]: r["cells"][1] for r in figures["fig-stages"]["rows"]}  # version 2's build
    assert stages["source"] == "cached" and stages["quantize"] == "built" and stages["publish"] == "built"
    assert "The newest version" in seen.dom["text"] and "version 2" in seen.dom["text"]
    covered, colours = ink(seen.screenshot)
    assert covered > 0.02 and colours > 50, (covered, colours)
    covered, colours = ink(seen.printed)
    assert covered > 0.02 and colours > 50, (covered, colours)
    assert seen.pdf.startswith(b"%PDF")


def test_the_index_links_every_recipe_with_a_trend(pages: Path, browser: Browser) -> None:
    index = pages / "index.html"
    seen = browser.render(index, READY, PROBE)
    assert seen.console_errors == [] and seen.requests == [index.resolve().as_uri()]
    assert sorted(seen.dom["links"]) == ["dense.html", "never_built.html"]
    assert all((pages / link).is_file() for link in seen.dom["links"])
    assert seen.dom["sparks"] == 1  # dense's trend; never_built has none
    assert "never built" in seen.dom["text"]
    assert ink(seen.screenshot)[0] > 0.01
    empty = browser.render(pages / "never_built.html", READY, PROBE)
    assert empty.console_errors == [] and "No version is published" in empty.dom["text"]


def test_writing_the_page_does_not_import_tensorflow(built: Path, tmp_path: Path) -> None:
    code = (
        "import sys\nfrom tpubuild.cli import main\n"
        f"try:\n    main(['report', 'dense', '--html', {str(tmp_path / 'p.html')!r}])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('tensorflow' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=built, capture_output=True, text=True)
    assert result.stderr.splitlines()[-1] == "False", result.stderr
    assert (tmp_path / "p.html").stat().st_size > 100_000  # the inlined script


def test_bad_uses_are_one_line_and_overwrite_nothing(built: Path, tmp_path: Path) -> None:
    mine = tmp_path / "notes.html"
    mine.write_text("<p>mine</p>")
    cases = [
        (["report", "dense", "--html", str(mine)], f"error: --html: {mine} exists and is not a page "
                                                   "`tpubuild report --html` wrote; not overwritten"),
        (["report", "dense", "--html", str(tmp_path)], f"error: --html {tmp_path}: a directory"),
        (["report", "--html", str(mine)], f"error: --html {mine}: not a directory"),
        (["report", "dense", "--html", str(tmp_path / "x.html"), "--format", "json"],
         "error: --format and --html cannot be used together"),
        (["report"], "error: missing RECIPE"),
    ]
    for args, start in cases:
        result = tpubuild(built, *args, env=QUIET)
        assert result.returncode == 2 and result.stderr.startswith(start), (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert mine.read_text() == "<p>mine</p>"
    again = tmp_path / "again.html"  # a page it wrote is replaced
    tpubuild(built, "report", "dense", "--html", str(again), env=QUIET, code=0)
    tpubuild(built, "report", "dense", "--html", str(again), env=QUIET, code=0)


def test_the_history_is_the_workspace_s_record_of_each_build(built: Path) -> None:
    history = json.loads((built / ".tpubuild" / "history" / "dense.json").read_text())
    outcomes = [(a["outcome"], a["version"]) for a in history["attempts"]]
    assert outcomes == [("published", 1), ("published", 2), ("failed", None)]
    failed = history["attempts"][2]
    assert failed["failed_stage"] == "verify" and failed["failed_figures"]["verify"]["passed"] is False
    assert [s["status"] for s in failed["stages"] if s["stage"] == "quantize"] == ["cached"]


def test_without_chromium_ci_fails_where_a_developer_skips(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.browser import chromium

    monkeypatch.setenv("PATH", str(tmp_path))  # a directory with no browser in it
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed"):
        chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        chromium()
