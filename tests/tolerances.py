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
"""

from __future__ import annotations

from dataclasses import dataclass
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
# bfloat16 keeps 8 mantissa bits: ~0.4% per rounding, a few roundings through a tiny model.
BFLOAT16 = Tolerance("bfloat16", rtol=1e-2, atol=1e-2)
# int8 has 256 levels over a tensor's range: ~0.4% per quantized layer, two or three layers.
INT8 = Tolerance("int8", rtol=5e-2, atol=1e-3)


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

