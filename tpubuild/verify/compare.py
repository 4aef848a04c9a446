"""Numerical verification: run the source and the artifact on the same samples, compare outputs.

An output passes when max|a - b| <= atol + rtol * max|b| (b = the source's output): the
relative term is scaled by the output's largest magnitude, not element by element, because
int8 and bfloat16 errors are proportional to the tensor's range, and near-zero elements
would otherwise make any relative bound meaningless.

NaN never passes: an output holding NaN (in the artifact or in the source) fails, whatever
the tolerances, because NaN compares false with everything and would otherwise vanish from
the error figures. An infinity matches only the same infinity.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tpubuild.quantize.datasets import Sample

# Defaults by the most lossy optimization applied (rtol, atol); see the module docstring.
# Exact stages still get 1e-5: oneDNN picks different kernels for different batch shapes
# (batching pads, io_shape reshapes), which changes float32 summation order.
TOLERANCES = {
    "exact": (1e-5, 1e-6),
    "bfloat16": (2e-2, 1e-3),  # 8-bit mantissa: ~0.4% per rounding, accumulated
    "int8": (5e-2, 1e-3),  # 256 levels over the range, accumulated through layers
}


def checked_tolerance(name: str, value: object) -> float:
    """`value` as a float; ValueError unless it is a finite number >= 0 (NaN would pass anything)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def default_tolerances(applied: list[str]) -> tuple[str, float, float]:
    """(kind, rtol, atol) for the stages that changed the model."""
    kind = "int8" if "quantize" in applied else "bfloat16" if "bfloat16" in applied else "exact"
    return (kind, *TOLERANCES[kind])


@dataclass
class OutputError:
    signature: str
    output: str
    max_abs_error: float
    max_rel_error: float  # max|a - b| / max|b|
    max_reference: float
    argmax_agreement: float | None  # for [..., classes] float outputs
    mismatched: int  # elements outside atol + rtol * max|b| (or unequal, for non-floats)
    elements: int
    nan_in_artifact: int = 0
    nan_in_source: int = 0
    # Compared element for element (integer, bool, string outputs: class ids, token ids):
    # any difference fails, so no tolerance can make the comparison vacuous.
    exact: bool = False
    # The artifact called on batches of this many rows (a batched model: verify's worst
    # batch size for this output), else None: on each sample alone.
    batch_size: int | None = None

    @property
    def passed(self) -> bool:
        return self.mismatched == 0 and self.nan_in_artifact == 0 and self.nan_in_source == 0

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "batch_size" or v is not None}


def run_signature(model: Any, key: str, samples: list[Sample]) -> dict[str, np.ndarray]:
    """Call signature `key` on every sample; outputs concatenated along a new first axis."""
    function = model.signatures[key]
    outputs: dict[str, list[np.ndarray]] = {}
    for sample in samples:
        try:
            result = function(**{name: tf.constant(value) for name, value in sample.items()})
        except tf.errors.OpError as exc:  # e.g. a random id beyond an embedding's rows
            from tpubuild.telling import telling_line

            raise ValueError(
                f"signature {key!r} fails on its verification samples: "
                f"{telling_line(exc.message) or type(exc).__name__}; if the model cannot take random inputs, give "
                "verify.representative_datasets") from None
        for name, tensor in result.items():
            outputs.setdefault(name, []).append(tensor.numpy())
    return {name: np.stack(values) for name, values in outputs.items()}


def compare_outputs(
    key: str, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], rtol: float, atol: float
) -> list[OutputError]:
    """One OutputError per output of the signature; ValueError naming an output that differs in kind."""
    errors = []
    for name in sorted(reference):
        if name not in candidate:
            raise ValueError(f"signature {key!r}: the artifact has no output {name!r}")
        ref, got = reference[name], candidate[name]
        if ref.shape != got.shape:
            raise ValueError(
                f"signature {key!r} output {name!r}: shape {list(got.shape[1:])} in the artifact, "
                f"{list(ref.shape[1:])} in the source"
            )
        errors.append(_compare(key, name, ref, got, rtol, atol))
    return errors


def _compare(key: str, name: str, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> OutputError:
    if ref.dtype.kind not in "fc" and got.dtype.kind not in "fc":
        unequal = int(np.sum(ref != got))
        return OutputError(key, name, float(unequal > 0), float(unequal > 0), 0.0, None, unequal, int(ref.size),
                           exact=True)
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    # Error figures over the elements finite in both; the others are counted, never averaged in.
    finite = np.isfinite(ref64) & np.isfinite(got64)
    diff = np.abs(ref64 - got64, where=finite, out=np.zeros(ref64.shape))
    max_ref = float(np.max(np.abs(ref64), where=np.isfinite(ref64), initial=0.0))
    max_abs = float(np.max(diff, initial=0.0))
    nan_ref, nan_got = int(np.sum(np.isnan(ref64))), int(np.sum(np.isnan(got64)))
    # An infinity in one and not the same infinity in the other (NaN aside: counted above).
    inf_mismatch = ~finite & ~np.isnan(ref64) & ~np.isnan(got64) & (ref64 != got64)
    if inf_mismatch.any():
        max_abs = math.inf
    max_rel = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else math.inf)
    agreement = None
    # Classification-like: float scores over a trailing class axis ([sample, batch, classes]).
    if ref.ndim >= 3 and ref.shape[-1] > 1:
        agreement = float(np.mean(np.argmax(ref64, axis=-1) == np.argmax(got64, axis=-1)))
    mismatched = int(np.sum(diff > atol + rtol * max_ref)) + int(np.sum(inf_mismatch))
    return OutputError(
        key, name, max_abs, max_rel, max_ref, agreement, mismatched, int(ref.size), nan_got, nan_ref
    )


def signature_outputs(model_dir: Path, tags: list[str],
                      sample_sets: list[dict[str, list[Sample]]]) -> list[dict[str, dict[str, np.ndarray]]]:
    """Load the SavedModel once, run every set of samples (signature key -> samples) and
    let the model go: a verifier holds one model at a time, never the source and the
    artifact together (a loaded model costs several times its weights). ValueError naming
    a signature the model does not have."""
    from tpubuild.memory import release_memory

    model = tf.saved_model.load(str(model_dir), tags=tags)
    outputs = run_sample_sets(model, sample_sets)
    del model
    release_memory()
    return outputs


def run_sample_sets(model: Any, sample_sets: list[dict[str, list[Sample]]]) -> list[dict[str, dict[str, np.ndarray]]]:
    """The outputs of a loaded model on every set of samples (signature key -> samples);
    ValueError naming a signature the model does not have."""
    outputs = []
    for samples_by_key in sample_sets:
        missing = sorted(k for k in samples_by_key if k not in model.signatures)
        if missing:
            raise ValueError(f"the artifact has no signature {missing[0]!r}")
        outputs.append({key: run_signature(model, key, samples) for key, samples in sorted(samples_by_key.items())})
    return outputs


def compare_all(reference: dict[str, dict[str, np.ndarray]], candidate: dict[str, dict[str, np.ndarray]],
                rtol: float, atol: float) -> list[OutputError]:
    """Every output of every signature in `reference`, compared with the candidate's."""
    return [error for key in sorted(reference) for error in compare_outputs(key, reference[key], candidate[key], rtol, atol)]


def compare_models(
    source: Path, artifact: Path, tags: list[str], samples_by_key: dict[str, list[Sample]], rtol: float, atol: float
) -> list[OutputError]:
    """Compare every output of the signatures sampled (one model loaded at a time)."""
    (candidate,) = signature_outputs(artifact, tags, [samples_by_key])
    (reference,) = signature_outputs(source, tags, [samples_by_key])
    return compare_all(reference, candidate, rtol, atol)


def batch_dimension_problem(model: Any, key: str, samples: list[Sample]) -> str | None:
    """Why signature `key` of a loaded model cannot be called on its samples grouped into
    batches (an input whose first dimension is static or absent, samples whose inputs
    disagree on their rows), or None when it can."""
    _, specs = model.signatures[key].structured_input_signature
    for name, spec in sorted(specs.items()):
        if spec.shape.rank == 0:
            return f"input {name!r} is a scalar"
        if spec.shape.rank is not None and spec.shape[0] is not None:
            return f"input {name!r} has a static batch dimension {spec.shape[0]}"
    for i, sample in enumerate(samples):
        rows = {np.shape(value)[0] if np.ndim(value) else None for value in sample.values()}
        if len(rows) != 1 or None in rows or 0 in rows:
            return f"the inputs of sample {i} do not share one first dimension"
    return None


class NotBatchMajor(ValueError):
    """An output of a signature called on a batch is not one row per row of the batch."""


@dataclass
class BatchedRun:
    """The outputs of one signature with its samples' rows grouped into calls of `batch_size`
    rows: per sample, as run_signature stacks them (comparable with the source's)."""

    batch_size: int
    outputs: dict[str, np.ndarray]
    calls: int
    padded_rows: int  # rows of padding added to the last call (copies of its first row)


def run_signature_batched(model: Any, key: str, samples: list[Sample], batch_size: int) -> BatchedRun:
    """Call signature `key` with the samples' rows grouped in order into batches of exactly
    `batch_size` rows, as a batching server forms a batch of that size from the requests it
    holds (requests concatenated along dimension 0). The last batch, when the rows run out,
    is padded the way BatchFunction pads a batch up to an allowed size: with copies of the
    first row of its first request (tensorflow/core/kernels/batching_util/
    batch_resource_base.cc, BatchResourceBase::ConcatInputTensors); the padding's outputs
    are dropped, as SplitOutputTensors drops them. Each sample's outputs are then its own
    rows of the batches it fell in, so a model whose row depends on the other rows of its
    batch differs from the source, which is run on every sample alone. NotBatchMajor naming
    an output whose first dimension is not the batch's; ValueError when a call fails."""
    function = model.signatures[key]
    names = sorted(samples[0])
    rows = [int(np.shape(sample[names[0]])[0]) for sample in samples]
    pooled = {name: np.concatenate([np.asarray(sample[name]) for sample in samples]) for name in names}
    total = sum(rows)
    pieces: dict[str, list[np.ndarray]] = {}
    calls = padded = 0
    for start in range(0, total, batch_size):
        real = min(batch_size, total - start)
        batch = {}
        for name, values in pooled.items():
            chunk = values[start:start + real]
            if real < batch_size:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch_size - real, axis=0)])
            batch[name] = chunk
        padded += batch_size - real
        calls += 1
        try:
            result = function(**{name: tf.constant(value) for name, value in batch.items()})
        except tf.errors.OpError as exc:
            from tpubuild.telling import telling_line

            raise ValueError(
                f"signature {key!r} fails on its verification samples in batches of {batch_size}: "
                f"{telling_line(exc.message) or type(exc).__name__}") from None
        for name, tensor in result.items():
            value = tensor.numpy()
            if value.ndim == 0 or value.shape[0] != batch_size:
                raise NotBatchMajor(
                    f"signature {key!r} output {name!r}: its first dimension is {list(value.shape[:1]) or 'absent'} "
                    f"on a batch of {batch_size} rows, not the batch: a batching server could not split it "
                    "between requests")
            pieces.setdefault(name, []).append(value[:real])
    outputs = {}
    bounds = np.cumsum([0, *rows])
    for name, parts in pieces.items():
        joined = np.concatenate(parts)
        outputs[name] = np.stack([joined[bounds[i]:bounds[i + 1]] for i in range(len(rows))])
    return BatchedRun(batch_size, outputs, calls, padded)
