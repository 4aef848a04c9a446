"""Errors in the user's own code and files are the user's: their frames and lines, no
`internal error`, the full traceback only with --debug (issue 13 item 9)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import export_recipe, export_variant


def test_syntax_error_in_an_export_script_names_its_line(make_workspace):
    ws = make_workspace({"syn": export_recipe("syn", "models/syn.py", "models/helper.py")})
    (ws / "recipes" / "models" / "syn.py").write_text("def export(output_dir):\n    x = (\n")
    result = tpubuild(ws, "build")
    assert result.returncode == 1
    assert "recipes/syn.yaml: stage export: recipes/models/syn.py:2:9: SyntaxError: '(' was never closed" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


def test_debug_shows_the_users_full_traceback(make_workspace):
    ws = make_workspace({"bad": export_recipe("bad", "models/bad_export.py", "models/helper.py")})
    plain = tpubuild(ws, "build")
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    debug = tpubuild(ws, "--debug", "build")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "recipes/models/bad_export.py\", line 2, in export" in debug.stderr
    assert "ValueError: no model today" in debug.stderr


def test_a_model_copied_without_its_variables_is_an_input_error(make_workspace):
    from tests.engine.conftest import source_recipe

    ws = make_workspace({"nv": source_recipe("nv")})
    shutil.rmtree(ws / "recipes" / "models" / "tiny" / "variables")
    result = tpubuild(ws, "build")
    assert result.returncode == 1
    assert ("recipes/nv.yaml: stage batch: the SavedModel's graph has 1 variable but it has no "
            "variables/variables.index: was its variables/ directory left out when it was copied?") in result.stderr
    assert "internal error" not in result.stderr


def test_a_worker_that_aborts_leaves_its_last_words_in_the_log_and_the_error(make_workspace):
    # Native code that aborts (LLVM's report_fatal_error, a failed CHECK) writes its last
    # line to file descriptor 2 and dies: that line must reach the log and the one-line error.
    ws = make_workspace({"abort": export_recipe("abort", "models/abort_export.py", "models/helper.py")})
    (ws / "recipes" / "models" / "abort_export.py").write_text(
        "import os\n\n\ndef export(output_dir):\n"
        "    os.write(2, b'-:12:3: error: something upstream\\nLLVM ERROR: Failed to infer result type(s)\\n')\n"
        "    os.abort()\n"
    )
    result = tpubuild(ws, "build")
    assert result.returncode == 1
    line = next(line for line in result.stderr.splitlines() if "worker process died" in line)
    assert "stage export" in line and "exit code -6" in line
    assert "LLVM ERROR: Failed to infer result type(s)" in line, line
    log = Path(line.rsplit("see ", 1)[1])
    assert "LLVM ERROR: Failed to infer result type(s)" in log.read_text()
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_verification_that_cannot_fail_is_a_warning_not_a_pass(make_workspace):
    # Outputs around 1e-11 against the default atol: an artifact returning zeros would pass,
    # so the build says the comparison is vacuous instead of reporting it as verified.
    ws = make_workspace({"tiny": export_recipe("tiny", "models/tiny_out.py", "models/helper.py")})
    export_variant(ws, "tiny_out.py", 'return {"y": tf.matmul(x, self.w)}',
                   'return {"y": tf.matmul(x, self.w) * 1e-11}')
    result = tpubuild(ws, "build")
    assert result.returncode == 0, result.stderr
    assert "signature 'serving_default' output 'y': the source's outputs are at most" in result.stderr
    assert "an artifact returning zeros would pass" in result.stderr
    import json

    report = json.loads((ws / "out" / "tiny" / "1" / "tpubuild-report.json").read_text())
    assert report["verify"]["vacuous"] == ["serving_default/y"]
