"""The TPU bodies' structure survives the stages that run after the tpu stage: the TPU
runtime's rules and TF's MLIR clustering bridge hold on the output of bfloat16 (scope TPU and
ALL), io_shape and batch, for every placed model of this directory, chained as a build runs them."""

from __future__ import annotations

import numpy as np
import pytest

from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import batch, bfloat16, io_shape
from tpubuild.tpu.findings import tpu_bodies
from tpubuild.tpu.mlir_bridge import bridge_findings
from tpubuild.tpu.runtime_rules import check_tpu_runtime_rules

BASE = {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}]}
BATCH = {
    "num_batch_threads": 1,
    "max_batch_size": 8,
    "batch_timeout_micros": 1000,
    "allowed_batch_sizes": [8],
    "max_enqueued_batches": 10,
    "disable_large_batch_splitting": False,
}


def assert_runtime_rules_hold(path) -> None:
    model = SavedModel.load(path)
    assert tpu_bodies(model)
    assert [str(f) for f in check_tpu_runtime_rules(model) if f.severity == "error"] == []
    assert [str(f) for f in bridge_findings(model)] == []


@pytest.mark.parametrize("name", ["toy", "mlp", "image", "two_calls", "control_flow"])
@pytest.mark.parametrize("scope", ["TPU", "ALL"])
def test_rules_hold_after_bfloat16_io_shape_and_batch(models, placed, run_stage, cpu_twin, name, scope):
    assert_runtime_rules_hold(placed[name])
    bf16 = {**BASE, "bfloat16_optimization_options": {"scope": scope, "skip_safety_checks": False, "filterlist": []}}
    out, _ = run_stage(bfloat16.run, placed[name], bf16)
    assert_runtime_rules_hold(out)
    out, _ = run_stage(io_shape.run, out, BASE)
    assert_runtime_rules_hold(out)
    out, _ = run_stage(batch.run, out, {**BASE, "batch_options": [BATCH]})
    assert_runtime_rules_hold(out)
    # And the twin of the whole chain still computes the source's function (bfloat16 tolerance:
    # 8 mantissa bits, so about 1e-2 relative after a few layers).
    source, twin = cpu_twin(models[name]), cpu_twin(out)
    inputs = {key: spec for key, spec in source.signatures["serving_default"].structured_input_signature[1].items()}
    rng = np.random.default_rng(0)
    feed = {k: rng.normal(size=[2 if d is None else d for d in s.shape]).astype(s.dtype.as_numpy_dtype) for k, s in inputs.items()}
    expected, got = source.signatures["serving_default"](**feed), twin.signatures["serving_default"](**feed)
    for key in expected:
        np.testing.assert_allclose(got[key].numpy(), expected[key].numpy(), rtol=5e-2, atol=5e-2, err_msg=key)
