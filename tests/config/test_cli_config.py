"""The planning verbs as a user runs them: real subprocesses, exit codes, no TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli import tpubuild
from tpubuild import __version__

GOOD = "model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions: [{function_alias: f}]\n"


def test_validate_from_a_subdirectory_finds_the_workspace(ws):
    ws.write("recipes/toy.yaml", GOOD)
    (ws.root / "deep" / "er").mkdir(parents=True)
    result = tpubuild(ws.root / "deep" / "er", "validate")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"1 recipe OK in {ws.root}\n"


def test_workspace_option_overrides_discovery(ws, tmp_path_factory):
    ws.write("recipes/toy.yaml", GOOD)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    result = tpubuild(elsewhere, "--workspace", str(ws.root), "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["toy", "models/toy", "[source", ">", "tpu", ">", "bfloat16", ">", "io_shape",
                                      ">", "verify", ">", "report", ">", "publish]"]


def test_no_workspace_is_a_one_line_error(tmp_path):
    result = tpubuild(tmp_path, "validate")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: no tpubuild.yaml in {tmp_path} or any parent directory: `tpubuild init` writes one here (where "
        "the recipes are, where outputs and the cache go), or pass --workspace PATH\n"
    )


def test_broken_recipe_exit_2_one_line_per_error_no_traceback(ws):
    ws.write("recipes/toy.yaml", GOOD)
    ws.write("recipes/bad.yaml", "model: {saved_model: ../models/toy}\nconverter:\n  batch_options: [{max_batch_size: -1}]\nverfy: {}\n")
    result = tpubuild(ws.root, "validate")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "recipes/bad.yaml:3:36: converter.batch_options[0].max_batch_size: must be >= 1, got -1",
        "recipes/bad.yaml:4:1: verfy: unknown key 'verfy' (did you mean 'verify'?)",
    ]


def test_debug_shows_the_traceback(ws):
    ws.write("recipes/bad.yaml", "model: {saved_model: ../nope}\n")
    result = tpubuild(ws.root, "--debug", "validate")
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "tpubuild.errors.ConfigError" in result.stderr


def test_unknown_target(ws):
    ws.write("recipes/toy.yaml", GOOD)
    result = tpubuild(ws.root, "validate", "tyo")
    assert (result.returncode, result.stderr) == (2, "error: no recipe matches 'tyo' (did you mean 'toy'?)\n")


def test_list_json_and_glob_targets(ws):
    ws.write("recipes/nlp-a.yaml", GOOD)
    ws.write("recipes/nlp-b.yaml", "model: {saved_model: ../models/toy}\n")
    ws.write("recipes/vision.yaml", GOOD)
    ws.write("recipes/vision.lock.yaml", "schema: '1'\n")  # lock files are never recipes
    result = tpubuild(ws.root, "list", "--json", "nlp-*")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"name": "nlp-a", "file": "recipes/nlp-a.yaml", "model": "models/toy",
         "stages": ["source", "tpu", "bfloat16", "io_shape", "verify", "report", "publish"],
         "targets": ["tpu_savedmodel"]},
        {"name": "nlp-b", "file": "recipes/nlp-b.yaml", "model": "models/toy",
         "stages": ["source", "verify", "report", "publish"], "targets": ["tpu_savedmodel"]},
    ]


def test_version_and_help():
    assert tpubuild(".", "--version").stdout == f"tpubuild, version {__version__}\n"
    help_text = tpubuild(".", "--help").stdout
    listed = help_text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    verbs = [line.split()[0] for line in listed.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert {"validate", "list"} <= set(verbs)
    for verb in verbs:  # every verb explains itself with an example
        assert "Example" in tpubuild(".", verb, "--help").stdout, verb


@pytest.mark.parametrize("argv", [["validate"], ["list", "--json"], ["--help"], ["validate", "--json", "recipes/exp.yaml"],
                                  ["list", "recipes/toy.yaml"], ["schema", "--content"]])
def test_planning_commands_never_import_tensorflow(ws, argv):
    ws.write("recipes/toy.yaml", GOOD)
    # validate parses an export script (ast), never runs it: its import of TensorFlow stays unexecuted.
    ws.write("models/exp.py", "import tensorflow as tf\n\ndef export(output_dir):\n    tf.saved_model.save(tf.Module(), output_dir)\n")
    ws.write("recipes/exp.yaml", "model:\n  export: {script: ../models/exp.py}\n")
    probe = (
        "import sys\nfrom tpubuild.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('TF_LOADED' if any(m == 'tensorflow' or m.startswith('tensorflow.') for m in sys.modules) else 'TF_FREE', code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, *argv], cwd=ws.root, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "TF_FREE 0", result.stderr
