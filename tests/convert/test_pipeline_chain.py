"""The converter's stage order on real models, driven by real recipes, and default states."""

from __future__ import annotations

import importlib
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.tolerances import BFLOAT16, assert_close
from tpubuild.config.recipe import load_recipe_file
from tpubuild.pipeline import TRANSFORMS, plan, stage_names
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages.base import StageContext


def _recipe(tmp_path: Path, model: Path, converter: str):
    """A recipe file beside a copy of `model` (recipes may only name paths inside their root)."""
    if not (tmp_path / "model").exists():
        shutil.copytree(model, tmp_path / "model")
    path = tmp_path / "r.yaml"
    body = textwrap.indent(textwrap.dedent(converter), "  ")
    path.write_text(f"name: r\nmodel:\n  saved_model: model\nconverter:\n{body}")
    return load_recipe_file(path)


def _build(recipe, tmp_path: Path) -> tuple[Path, list[str], dict]:
    """Run the recipe's transform stages in pipeline order, each on the previous output."""
    current = Path(recipe.canonical["model"]["saved_model"])
    if not current.is_absolute():
        current = recipe.root / current
    context = StageContext(tmp_path, inputs={"source": current})
    ran = []
    for stage in plan(recipe.canonical):
        if stage.name not in TRANSFORMS - {"source", "export"}:
            continue
        module, func = _entry(stage.name)
        out = tmp_path / stage.name
        out.mkdir()
        result = getattr(importlib.import_module(module), func)(current, out, stage.options, context)
        context.inputs[stage.name] = out
        context.results[stage.name] = result.summary
        current = out
        ran.append(stage.name)
    return current, ran, context.results


def _entry(name: str) -> tuple[str, str]:
    from tpubuild.pipeline import entry

    module, func = entry(name).split(":")
    return module, func


BATCHING = """
batch_options:
  - num_batch_threads: 2
    max_batch_size: 16
    batch_timeout_micros: 1000
    allowed_batch_sizes: [4, 8, 16]
    max_enqueued_batches: 20
"""


def test_tpu_bfloat16_io_shape_batch_chain_on_the_twin(models, tmp_path, cpu_twin):
    recipe = _recipe(
        tmp_path,
        models["image"],
        "tpu_functions:\n  - function_alias: tpu_func\n" + BATCHING,
    )
    out, ran, results = _build(recipe, tmp_path)
    assert ran == ["tpu", "bfloat16", "io_shape", "batch"]
    model = SavedModel.load(out)
    ops = {n.op for f in model.functions.values() for n in f.node_def}
    assert {"BatchFunction", "TPUPartitionedCall", "TPUReplicateMetadata", "Reshape"} <= ops
    (site,) = results["batch"]["sites"]
    assert site["callee"] == results["io_shape"]["functions"][0]["wrapper"]
    src = tf.saved_model.load(str(models["image"]))
    twin = cpu_twin(out)
    rng = np.random.default_rng(5)
    for batch in (1, 3, 8):
        inputs = {
            "image": tf.constant(rng.normal(size=(batch, 4, 4, 3)).astype(np.float32)),
            "seq": tf.constant(rng.normal(size=(batch, 2, 2)).astype(np.float32)),
        }
        want = src.signatures["serving_default"](**inputs)
        got = twin.signatures["serving_default"](**inputs)
        for key in want:
            # The chain converted the TPU function to bfloat16: bfloat16 against float32.
            assert_close(got[key].numpy(), want[key].numpy(), BFLOAT16, f"{key}, batch {batch}")


def test_signature_batching_after_bfloat16(models, tmp_path, cpu_twin):
    recipe = _recipe(
        tmp_path,
        models["mlp"],
        "tpu_functions:\n  - function_alias: tpu_func\n"
        + BATCHING
        + "    experimental: {signature_name: serving_default}\n"
        + "bfloat16_optimization_options: {filterlist: [Softmax]}\n",
    )
    out, ran, results = _build(recipe, tmp_path)
    assert ran == ["tpu", "bfloat16", "io_shape", "batch"]
    assert results["batch"]["mode"] == "signature"
    x = tf.constant(np.random.default_rng(6).normal(size=(5, 16)).astype(np.float32))
    want = tf.saved_model.load(str(models["mlp"])).signatures["serving_default"](x=x)
    got = cpu_twin(out).signatures["serving_default"](x=x)
    for key in want:
        # bfloat16 TPU function (Softmax kept float32) against the float32 source.
        assert_close(got[key].numpy(), want[key].numpy(), BFLOAT16, key)


@pytest.mark.parametrize(
    ("converter", "expected"),
    [
        ("", ["bfloat16", "io_shape"]),
        ("disable_default_optimizations: true\n", []),
        ("disable_default_optimizations: true\nbfloat16_optimization: ENABLED\n", ["bfloat16"]),
        ("disable_default_optimizations: true\nio_shape_optimization: ENABLED\n", ["io_shape"]),
        ("bfloat16_optimization: DISABLED\n", ["io_shape"]),
        ("io_shape_optimization: DISABLED\n", ["bfloat16"]),
    ],
)
def test_default_optimizations_follow_the_converter(models, tmp_path, converter, expected):
    recipe = _recipe(tmp_path, models["toy"], "tpu_functions:\n  - function_alias: tpu_func\n" + converter)
    names = stage_names(recipe.canonical)
    assert [n for n in names if n in ("bfloat16", "io_shape")] == expected


def test_scope_all_runs_bfloat16_without_tpu_functions(models, tmp_path):
    recipe = _recipe(tmp_path, models["mlp"], "bfloat16_optimization_options: {scope: ALL}\n")
    assert [n for n in stage_names(recipe.canonical) if n in TRANSFORMS] == ["source", "bfloat16"]
    out, ran, results = _build(recipe, tmp_path)
    assert ran == ["bfloat16"]
    assert results["bfloat16"]["variables"] == ["b2", "w1", "w2"]
