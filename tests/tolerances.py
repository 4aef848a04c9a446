"""Named tolerances for comparing TensorFlow float results in tests: never bit-exact.

TensorFlow's CPU kernels are not bit-reproducible: the code path depends on the CPU (AVX2
vs AVX-512, Intel vs AMD), on the kernel library (oneDNN or Eigen, `TF_ENABLE_ONEDNN_OPTS`)
and on the shape of the call (a batch of 8 is summed in another order than 8 batches of 1,
and a BatchFunction pads and concatenates requests). An AMD EPYC gave 1.3106321096420288
where an Intel CPU gave 1.310632348060608 for the same batched float32 call (issue 13).

A bound is `atol + rtol * max|want|`, scaled by the tensor's largest magnitude as tpubuild's
own verify stage does (tpubuild/verify/compare.py): the rounding error of a dot product
is proportional to the magnitude of its terms, not to the result element, so an element
that cancels to about zero would break a purely element-wise relative bound.

Every bound is for the precision the artifact computes in, not the one its inputs and
outputs have: a model whose TPU function the bfloat16 stage converted returns float32
tensors computed in bfloat16, on its CPU twin too (docs/targets/cpu_savedmodel.md). A test
that runs an artifact it did not make itself asks `computes_in` and takes the bound for that.
A format with p significand bits (the implicit one included) rounds to nearest within the
unit roundoff u = 2^-p per operation: float32 2^-24 = 6.0e-8, bfloat16 2^-8 = 3.9e-3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    name: str
    rtol: float
    atol: float


# The same float32 computation, summed in another order (other CPU, other kernel, other batch
# composition): a few ulps (float32 eps 1.2e-7) per accumulation; 1e-5 of the largest value
# leaves room for the tiny models' dot products (at most a few hundred terms) and nothing else.
FLOAT32_REORDERED = Tolerance("float32 reordered", rtol=1e-5, atol=1e-6)
# bfloat16 keeps 8 significand bits: u = 3.9e-3 per rounding; 1e-2 (about 2.6 u of the
# largest value) holds a few roundings through a tiny model, whose errors partly cancel.
BFLOAT16 = Tolerance("bfloat16", rtol=1e-2, atol=1e-2)
# int8 has 256 levels over a tensor's range: ~0.4% per quantized layer, two or three layers.
INT8 = Tolerance("int8", rtol=5e-2, atol=1e-3)

UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
# The same computation on other kernels (another loader, other fusions), by the precision
# it runs in: a kernel that rounds in another order errs by a few units of that precision.
REORDERED = {"float32": FLOAT32_REORDERED, "bfloat16": BFLOAT16}


def computes_in(saved_model: Path, op: str | None = None) -> str:
    """"bfloat16" when a node of the SavedModel (its graph or any function; only `op` nodes,
    if given) has a bfloat16 type attribute, else "float32": which precision its numbers
    are rounded to, whatever dtype its signatures have."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(saved_model) / "saved_model.pb").read_bytes())
    nodes = [node for meta_graph in proto.meta_graphs
             for node in [*meta_graph.graph_def.node,
                          *(n for f in meta_graph.graph_def.library.function for n in f.node_def)]
             if op is None or node.op == op]
    assert nodes, f"{saved_model}: no {op or ''} node"
    for node in nodes:
        for value in node.attr.values():
            if value.type == types_pb2.DT_BFLOAT16 or types_pb2.DT_BFLOAT16 in value.list.type:
                return "bfloat16"
    return "float32"


def softmax_sum_atol(precision: str, classes: int) -> float:
    """How far from 1 the outputs of a softmax computed in `precision` may sum.

    Whatever error the logits carry, exact softmax outputs sum to 1; only the softmax's own
    roundings move the sum. Each output exp(x_i)/S is rounded by its exp (within 2 u: the
    vectorized exp of Eigen and oneDNN is not correctly rounded), the sum S of `classes`
    terms (classes - 1 additions) and the division, which Eigen's kernel makes a reciprocal
    and a product: (classes + 3) u relative to each output, so (classes + 3) u to their sum
    of 1 (a kernel that accumulates in float32 and rounds its result to bfloat16 once, as
    oneDNN's does, errs less). A bfloat16 softmax of 4 classes: 7 u = 2.7e-2 (the
    LSTM example's CPU SavedModel sums to 0.99707 on an AMD EPYC with avx512_bf16); float32
    4.2e-7.
    """
    return (classes + 3) * UNIT_ROUNDOFF[precision]


def assert_close(got: Any, want: Any, tolerance: Tolerance, err_msg: str = "") -> None:
    """Shapes (and dtypes, for arrays) exactly; values within `tolerance` of `want`."""
    if isinstance(got, np.ndarray) and isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{err_msg}: dtype {got.dtype} != {want.dtype}"
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got64.shape == want64.shape, f"{err_msg}: shape {got64.shape} != {want64.shape}"
    assert np.all(np.isfinite(want64)), f"{err_msg}: the reference holds non-finite values"
    bound = tolerance.atol + tolerance.rtol * (float(np.max(np.abs(want64))) if want64.size else 0.0)
    np.testing.assert_allclose(
        got64, want64, rtol=0, atol=bound, err_msg=f"{err_msg} ({tolerance.name}: |got - want| <= {bound:.3g})"
    )

