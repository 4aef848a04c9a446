"""Real builds of quantized recipes, then `tpubuild report` on the published versions."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli import tpubuild

RECIPE = """
name: dense
model: {{saved_model: ../models/dense}}
converter:
  quantization_options: {{method: {method}}}
verify: {{samples: 8{tolerance}}}
"""


QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def write_recipe(root: Path, method: str, tolerance: str = "") -> None:
    (root / "recipes" / "dense.yaml").write_text(textwrap.dedent(RECIPE.format(method=method, tolerance=tolerance)))


@pytest.fixture(scope="module")
def built(dense: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose recipe `dense` was built twice: WEIGHT_ONLY (1), DYNAMIC_RANGE (2)."""
    root = tmp_path_factory.mktemp("ws")
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\noutput_dir: out\ncache_dir: .tpubuild/cache\n")
    shutil.copytree(dense, root / "models" / "dense")
    (root / "recipes").mkdir()
    (root / "recipes" / "never_built.yaml").write_text("model: {saved_model: ../models/dense}\n")
    for method in ("WEIGHT_ONLY", "DYNAMIC_RANGE"):
        write_recipe(root, method)
        result = tpubuild(root, "build", "dense", env=QUIET)
        assert result.returncode == 0, result.stderr
    return root


def test_report_prints_the_newest_version(built: Path) -> None:
    result = tpubuild(built, "report", "dense", env=QUIET)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    total = json.loads((built / "out" / "dense" / "2" / "tpubuild-report.json").read_text())["cost"]["total"]
    # Float32 MatMuls alone are 2*64*128 + 2*128*10 FLOPs; quantize/dequantize work adds to it.
    assert total > 2 * 64 * 128 + 2 * 128 * 10
    assert lines[:4] == [
        f"version 2 ({built / 'out' / 'dense' / '2'})",
        "Conversion report for dense",
        f"TPU cost of the model: 0.00% (0/{total})",
        f"CPU cost of the model: 100.00% ({total}/{total})",
    ]
    assert "Parameters: artifact 9.8 KiB, source 37.5 KiB; ratio 0.260" in lines
    assert any(line.startswith("Quantization: DYNAMIC_RANGE (op set XLA); quantized layers: MatMul 2/2") for line in lines)


def test_report_formats_are_the_published_files(built: Path) -> None:
    version = built / "out" / "dense" / "2"
    as_json = json.loads(tpubuild(built, "report", "dense", "--format", "json", env=QUIET).stdout)
    # With the stages' peak memory measured when they were built, from the lock file.
    peaks = as_json.pop("peak_memory")
    assert peaks["build"] == max(peaks["stages"].values()) and "verify" in peaks["stages"], peaks
    assert as_json == json.loads((version / "tpubuild-report.json").read_text())
    markdown = tpubuild(built, "report", "dense", "--format", "markdown", env=QUIET).stdout
    assert markdown == (version / "tpubuild-report.md").read_text()
    old = json.loads(tpubuild(built, "report", "dense", "--version", "1", "--format", "json", env=QUIET).stdout)
    assert old["quantization"]["method"] == "WEIGHT_ONLY"


def test_report_against_an_older_version(built: Path) -> None:
    result = tpubuild(built, "report", "dense", "--against", "1", env=QUIET)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dense: version 1 -> version 2"
    assert lines[1] == "                      version 1      version 2  change"
    assert [line.split()[0] for line in lines[2:]] == [
        "size", "parameter_bytes", "cost_total", "tpu_share", "max_abs_error"
    ]
    assert lines[3] == f"{'parameter_bytes':16} {'9.8 KiB':>14} {'9.8 KiB':>14}  x1.000"
    as_json = json.loads(tpubuild(built, "report", "dense", "--against", "1", "--format", "json", env=QUIET).stdout)
    assert (as_json["old"], as_json["new"]) == (1, 2)
    assert as_json["difference"]["tpu_share"] == {"old": 0.0, "new": 0.0}


def test_report_errors_are_one_line(built: Path) -> None:
    result = tpubuild(built, "report", "dense", "--version", "9", env=QUIET)
    assert (result.returncode, result.stderr) == (
        2, f"error: dense: no version 9 in {built / 'out' / 'dense'}; published versions: 1, 2\n"
    )
    result = tpubuild(built, "report", "never_built", env=QUIET)
    assert (result.returncode, result.stderr) == (
        2, f"error: never_built: no published version in {built / 'out' / 'never_built'}; "
        "run `tpubuild build never_built`\n"
    )


def test_report_does_not_import_tensorflow(built: Path) -> None:
    code = (
        "import sys\nfrom tpubuild.cli import main\n"
        "try:\n    main(['report', 'dense'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('tensorflow' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=built, capture_output=True, text=True)
    assert result.stderr.splitlines()[-1] == "False"


def test_too_tight_tolerance_fails_the_build_with_the_error(built: Path) -> None:
    write_recipe(built, "DYNAMIC_RANGE", ", rtol: 1.0e-6, atol: 1.0e-7")
    try:
        result = tpubuild(built, "build", "dense", env=QUIET)
    finally:
        write_recipe(built, "DYNAMIC_RANGE")
    assert result.returncode == 1
    assert "toy" not in result.stderr
    assert (
        "recipes/dense.yaml: stage verify: signature 'serving_default' output 'logits' differs from the source: max abs error "
        in result.stderr
    ), result.stderr
    assert not (built / "out" / "dense" / "3").exists()
