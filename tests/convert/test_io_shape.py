"""The io_shape stage on a real TPU-placed SavedModel: layouts, exact outputs on the twin."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.tolerances import FLOAT32_REORDERED, assert_close
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import io_shape

OPTIONS = {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}]}


def _inputs(batch: int, length: int) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(batch)
    return {
        "image": tf.constant(rng.normal(size=(batch, 4, 4, 3)).astype(np.float32)),
        "seq": tf.constant(rng.normal(size=(batch, length, 2)).astype(np.float32)),
    }


def test_rank4_tensors_cross_as_rank2_and_outputs_are_identical(models, placed, run_stage, cpu_twin):
    out, result = run_stage(io_shape.run, placed["image"], OPTIONS)
    (fn,) = result.summary["functions"]
    assert [i["tensor"] for i in fn["inputs"]] == ["input image"]
    assert fn["inputs"][0]["transfer_shape"] == [-1, 48]
    assert [(o["shape"], o["transfer_shape"]) for o in fn["outputs"]] == [([-1, 4, 4, 3], [-1, 48])]
    assert fn["left_alone"] == [
        "input seq: non-batch dimensions unknown when the model is built",
        "output identity: rank 2 already transfers as is",
    ]
    assert result.warnings == [
        f'io_shape: "tpu_func" (alias of {fn["function"]}) input seq: non-batch dimensions '
        "unknown when the model is built"
    ]
    model = SavedModel.load(out)
    # Replaced in place, not copied: the alias names the function the call runs, and no
    # unreachable copy of the TPU body (and of its weights) is left in the library.
    assert fn["wrapper"] == fn["function"]
    assert model.aliases[fn["function"]] == "tpu_func"
    assert not [name for name in model.functions if name.endswith("_io")]
    wrapper = model.functions[fn["wrapper"]]
    # The TPU side reshapes back first thing, inside the same TPU cluster.
    reshapes = [n for n in wrapper.node_def if n.op == "Reshape"]
    assert len(reshapes) == 2 and all("_tpu_replicate" in n.attr for n in reshapes)
    assert any(n.op == "TPUReplicateMetadata" for n in wrapper.node_def)
    (site,) = fn["call_sites"]
    call = next(n for n in model.functions[site["caller"]].node_def if n.name == site["node"])
    assert (call.op, call.attr["f"].func.name) == ("TPUPartitionedCall", fn["wrapper"])
    src = tf.saved_model.load(str(models["image"]))
    twin = cpu_twin(out)
    for batch, length in ((1, 1), (3, 5), (8, 2)):
        want = src.signatures["serving_default"](**_inputs(batch, length))
        got = twin.signatures["serving_default"](**_inputs(batch, length))
        for key in want:
            # Same ops on rank-2 transfer layouts: the kernels may take other code paths
            # (and sum in another order) for the reshaped tensors, so close, not bit-equal.
            assert_close(got[key].numpy(), want[key].numpy(), FLOAT32_REORDERED, f"{key}, batch {batch}")


def test_the_rewritten_function_restores_with_its_transfer_layouts(models, placed, run_stage, tmp_path):
    """Rewritten in place, the saved tf.function behind the alias takes [batch, 48] and
    returns it: its object-graph records say so, so TF2's loader restores it as a callable
    and the report's HLO (traced from those records) exists."""
    from tpubuild.tpu.hlo import function_hlo
    from tpubuild.tpu.twin import make_cpu_twin

    out, result = run_stage(io_shape.run, placed["image"], OPTIONS)
    (fn,) = result.summary["functions"]
    twin_dir = tmp_path / "twin"
    make_cpu_twin(out, twin_dir)
    twin = tf.saved_model.load(str(twin_dir))
    src = tf.saved_model.load(str(models["image"]))
    inputs = _inputs(3, 5)
    want = src.tpu_func(inputs["image"], inputs["seq"])
    got = twin.tpu_func(tf.reshape(inputs["image"], [3, 48]), inputs["seq"])
    assert got["scaled"].shape == (3, 48) and got["pooled"].shape == (3, 3)
    # The same ops on reshaped tensors: close, not bit-equal (see above).
    assert_close(tf.reshape(got["scaled"], [3, 4, 4, 3]).numpy(), want["scaled"].numpy(), FLOAT32_REORDERED)
    assert_close(got["pooled"].numpy(), want["pooled"].numpy(), FLOAT32_REORDERED)
    hlo = function_hlo(twin_dir, ["serve"], [fn["function"]])[fn["function"]]
    assert "hlo" in hlo, hlo
    assert "f32[1,48]" in hlo["hlo"]


def test_rank2_tensors_are_left_alone(placed, run_stage):
    out, result = run_stage(io_shape.run, placed["toy"], OPTIONS)
    (fn,) = result.summary["functions"]
    assert fn["wrapper"] is None
    assert fn["left_alone"] == [
        "input x: rank 2 already transfers as is",
        "output identity: rank 2 already transfers as is",
    ]
    assert result.warnings == []
