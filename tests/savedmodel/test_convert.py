"""`tpubuild convert`: options file, recipe, refusals, and every example recipe end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from sm_models import SIGNATURES, run_signature

from tests.cli import REPO, run_cli
from tests.tolerances import FLOAT32_REORDERED, assert_close
from tpubuild.config.recipe import discover, load_recipe_file
from tpubuild.config.workspace import load_workspace
from tpubuild.convert import RUNNABLE
from tpubuild.pipeline import stage_names
from tpubuild.quantize.datasets import random_samples, signature_inputs
from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.mlir_bridge import bridge_findings
from tpubuild.tpu.runtime_rules import check_tpu_runtime_rules
from tpubuild.tpu.twin import make_cpu_twin
from tpubuild.verify.compare import compare_models, default_tolerances

# The workspace's own discovery: recipe globs, lock files excluded.
EXAMPLES = discover(load_workspace(override=REPO / "tpubuild.yaml"))


def write_options(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "options.yaml"
    path.write_text(text)
    return path


TPU_ONLY = """\
converter:
  tpu_functions:
    - function_alias: tpu_func
  bfloat16_optimization: DISABLED
  io_shape_optimization: DISABLED
"""


def test_options_file_places_and_twin_is_exact(zoo, tmp_path, inputs):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("convert", str(zoo), str(out), "--options-file", str(write_options(tmp_path, TPU_ONLY)))
    assert code == 0, stderr
    assert stdout == f"converted {zoo} -> {out} (tpu)\n"
    model = SavedModel.load(out)
    assert "TPUPartitionedCall" in {n.op for f in model.functions.values() for n in f.node_def}
    make_cpu_twin(out, tmp_path / "twin")
    for key in SIGNATURES:
        expected, got = run_signature(zoo, key, inputs), run_signature(tmp_path / "twin", key, inputs)
        for name in expected:
            # The twin runs the placed function through other call ops: same float32 math,
            # no bit-reproducibility across CPUs and code paths.
            assert_close(got[name], expected[name], FLOAT32_REORDERED, f"{key}.{name}")
    # Only OUT_DIR appears next to it: the stages' temp directory is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["options.yaml", "out", "twin"]


def test_refuses_a_non_empty_output_directory(zoo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, stderr = run_cli("convert", str(zoo), str(out), "--options-file", str(write_options(tmp_path, TPU_ONLY)))
    assert (code, stderr) == (2, f"error: {out}: output directory exists and is not empty\n")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_needs_exactly_one_of_recipe_and_options_file(zoo, tmp_path):
    code, _, stderr = run_cli("convert", str(zoo), str(tmp_path / "out"))
    assert code == 2
    assert stderr == (
        "Usage: tpubuild convert [OPTIONS] [SRC_DIR] [OUT_DIR]\n"
        "Try 'tpubuild convert --help' for help.\n\n"
        "Error: give exactly one of --recipe FILE, --options-file FILE or --converter_options_string TEXT\n"
    )


def test_converting_a_converted_model_says_so_in_one_line(zoo, tmp_path):
    options = write_options(tmp_path, TPU_ONLY)
    once = tmp_path / "once"
    code, _, stderr = run_cli("convert", str(zoo), str(once), "--options-file", str(options))
    assert code == 0, stderr
    code, stdout, stderr = run_cli("convert", str(once), str(tmp_path / "twice"), "--options-file", str(options))
    assert (code, stdout) == (1, "")
    [line] = stderr.splitlines()
    assert line.startswith(f"error: {once}: already converted for the TPU (") and "TPUPartitionedCall" in line, line
    assert line.endswith("; convert the SavedModel it was made from")
    assert not (tmp_path / "twice").exists()


def test_conversion_error_leaves_nothing_behind(zoo, tmp_path):
    options = write_options(tmp_path, TPU_ONLY.replace("alias: tpu_func", "alias: tpu_fnc"))
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("convert", str(zoo), str(out), "--options-file", str(options))
    assert code == 1, stderr
    assert stderr.splitlines()[-1].startswith(
        'error: tpu_functions[0]: unknown function alias "tpu_fnc" (did you mean "tpu_func"?); aliases: '
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["options.yaml"]


def export(recipe_file: Path, out: Path) -> None:
    """Run the recipe's export script, as the export stage would."""
    recipe = load_recipe_file(recipe_file)
    spec_export = recipe.canonical["model"]["export"]
    spec = importlib.util.spec_from_file_location(f"export_{recipe.name}", recipe.root / spec_export["script"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    getattr(module, spec_export["function"])(str(out))


def samples_for(model: SavedModel, key: str) -> list[dict[str, np.ndarray]]:
    specs = signature_inputs(model, key)
    strings = {name for name, spec in specs.items() if spec.dtype.kind in "OSU"}
    samples = random_samples({k: v for k, v in specs.items() if k not in strings}, 4, seed=0)
    for i, sample in enumerate(samples):  # text inputs: rows of numbers, as string models parse
        for name in strings:
            sample[name] = np.array([f"{i} 0.5 -1 2", "1 2 3 4"], dtype=object)
    return samples


@pytest.mark.parametrize("recipe_file", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_recipe_converts(recipe_file, tmp_path):
    recipe = load_recipe_file(recipe_file)
    stages = [s for s in stage_names(recipe.canonical) if s in RUNNABLE]
    src, out, twin = tmp_path / "src", tmp_path / "out", tmp_path / "twin"
    export(recipe_file, src)
    code, stdout, stderr = run_cli("convert", str(src), str(out), "--recipe", str(recipe_file))
    assert code == 0, stderr
    assert stdout == f"converted {src} -> {out} ({', '.join(stages)})\n"

    tf.saved_model.load(str(out))
    model = SavedModel.load(out)
    found = {n.op for f in model.functions.values() for n in f.node_def}
    expected_ops = {"tpu": {"TPUPartitionedCall", "TPUOrdinalSelector", "TPUReplicateMetadata"}, "batch": {"BatchFunction"}}
    for stage, ops in expected_ops.items():
        if stage in stages:
            assert ops <= found, stage
    if "bfloat16" in stages and "quantize" not in stages:  # quantized TPU bodies hold int8 constants, no variables
        variables = [n.variable for n in model.meta_graph.object_graph_def.nodes if n.WhichOneof("kind") == "variable"]
        assert any(v.dtype == tf.bfloat16.as_datatype_enum for v in variables)

    if "tpu" in stages:
        # The TPU runtime's rules and TF's MLIR clustering bridge hold after every later
        # stage too (bfloat16 and io_shape edit the TPU bodies).
        assert [str(f) for f in check_tpu_runtime_rules(model) if f.severity == "error"] == []
        assert [str(f) for f in bridge_findings(model)] == []
    make_cpu_twin(out, twin)
    _, rtol, atol = default_tolerances(stages)
    source = SavedModel.load(src)
    samples = {key: samples_for(source, key) for key in source.signatures}
    errors = compare_models(src, twin, ["serve"], samples, rtol, atol)
    assert errors and [e.as_dict() for e in errors if not e.passed] == []  # within tolerances, no NaN


def test_publishes_into_an_existing_empty_directory(zoo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code, _, stderr = run_cli("convert", str(zoo), str(out), "--options-file", str(write_options(tmp_path, TPU_ONLY)))
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["assets", "fingerprint.pb", "saved_model.pb", "variables"]


def test_nothing_to_do_publishes_an_unchanged_copy(zoo, tmp_path, inputs):
    out = tmp_path / "out"
    options = write_options(tmp_path, "converter: {}\n")
    code, stdout, stderr = run_cli("convert", str(zoo), str(out), "--options-file", str(options))
    assert code == 0, stderr
    assert stdout == f"converted {zoo} -> {out} (no stage)\n"
    assert (out / "saved_model.pb").read_bytes() == SavedModel.load(zoo).proto.SerializeToString(deterministic=True)
    # An unchanged graph; TF's CPU kernels still promise no bit-reproducibility.
    assert_close(run_signature(out, "serving_default", inputs)["y"], run_signature(zoo, "serving_default", inputs)["y"], FLOAT32_REORDERED)
