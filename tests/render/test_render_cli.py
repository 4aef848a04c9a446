"""`tpubuild render` as a user runs it: real subprocesses on the example workspace and
on workspaces written under tmp_path; exit codes, exact messages, no TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.cli import REPO, tpubuild
from tpubuild.config.recipe import load_recipe_file
from tpubuild.render import Spelling, render


def test_render_toy_prints_its_text_proto() -> None:
    result = tpubuild(REPO / "recipes" / "models", "render", "toy")  # the workspace is found upward
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (
        "tpu_functions {\n"
        '  function_alias: "tpu_func"\n'
        "}\n"
        "batch_options {\n"
        "  num_batch_threads: 2\n"
        "  max_batch_size: 8\n"
        "  batch_timeout_micros: 5000\n"
        "  allowed_batch_sizes: 2\n"
        "  allowed_batch_sizes: 4\n"
        "  allowed_batch_sizes: 8\n"
        "  max_enqueued_batches: 10\n"
        "}\n"
    )


def test_render_a_recipe_file_from_outside_the_workspace(tmp_path: Path) -> None:
    result = tpubuild(tmp_path, "render", str(REPO / "recipes" / "quantized.yaml"), "--path-prefix", "/ws")
    assert (result.returncode, result.stderr) == (0, "")
    recipe = load_recipe_file(REPO / "recipes" / "quantized.yaml")
    spelling = Spelling(recipe.written_converter, recipe.root, tmp_path, recipe.absolute_paths)
    assert result.stdout == render(recipe.canonical, path_prefix="/ws", spelling=spelling)
    assert 'tfrecord_file_path: "/ws/recipes/data/quantized.tfrecord"\n' in result.stdout
    # The fields the recipe writes, no more: it leaves op_set and tags to their defaults.
    assert "op_set" not in result.stdout and "tags" not in result.stdout
    assert "op_set: XLA\n" in render(recipe.canonical, path_prefix="/ws")  # the canonical form spells them out


def test_json_and_yaml_formats(tmp_path: Path) -> None:
    recipe = load_recipe_file(REPO / "recipes" / "batch_function.yaml")
    as_json = tpubuild(tmp_path, "--workspace", str(REPO), "render", "batch_function", "--format", "json")
    as_yaml = tpubuild(tmp_path, "--workspace", str(REPO), "render", "batch_function", "--format", "yaml")
    assert (as_json.returncode, as_yaml.returncode) == (0, 0)
    assert json.loads(as_json.stdout) == recipe.canonical["converter"]
    assert yaml.safe_load(as_yaml.stdout) == recipe.canonical["converter"]


def test_a_target_must_name_one_recipe() -> None:
    several = tpubuild(REPO, "render", "t*")
    assert (several.returncode, several.stdout) == (2, "")
    assert several.stderr == "error: render takes one recipe; 't*' matches 2: toy, two_tpu_functions\n"
    unknown = tpubuild(REPO, "render", "tyo")
    assert (unknown.returncode, unknown.stderr) == (2, "error: no recipe matches 'tyo' (did you mean 'toy'?)\n")


def test_unknown_format_is_a_usage_error() -> None:
    result = tpubuild(REPO, "render", "toy", "--format", "pbtxt")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--format': 'pbtxt' is not one of 'textproto', 'textproto-v2', 'json', 'yaml'."
    )


def test_npz_dataset_cannot_be_rendered_for_the_converter(tmp_path: Path) -> None:
    (tmp_path / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "saved_model.pb").write_bytes(b"")  # config loading only checks it exists
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "q.npz").write_bytes(b"")
    (tmp_path / "recipes" / "q.yaml").write_text(
        "model: {saved_model: ../models/m}\n"
        "converter:\n"
        "  quantization_options:\n"
        "    representative_datasets: {serving_default: {npz: q.npz}}\n"
    )
    result = tpubuild(tmp_path, "render", "q")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "recipes/q.yaml: converter.quantization_options.representative_datasets.serving_default: "
        "the converter reads only TFRecord datasets (tfrecord_file_path), not npz; "
        "write one with tf.quantization.experimental.TfRecordRepresentativeDatasetSaver\n"
    )
    assert tpubuild(tmp_path, "render", "q", "--format", "json").returncode == 0


def test_render_never_imports_tensorflow() -> None:
    probe = (
        "import sys\nfrom tpubuild.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('TF_LOADED' if any(m == 'tensorflow' or m.startswith('tensorflow.') for m in sys.modules) else 'TF_FREE', code)\n"
    )
    for target in ("quantized", "recipes/toy.yaml"):
        result = subprocess.run(
            [sys.executable, "-c", probe, "render", target], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert result.stdout.splitlines()[-1] == "TF_FREE 0", result.stderr


def test_render_help_has_an_example() -> None:
    result = tpubuild(REPO, "render", "--help")
    assert result.returncode == 0
    assert "tpubuild render toy" in result.stdout
    assert '--converter_options_string="$(tpubuild render toy --path-prefix /ws)"' in result.stdout
