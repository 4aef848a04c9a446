"""Representative datasets: npz / generator samples checked against a signature, TFRecord I/O.

A sample is a dict `{input_name: np.ndarray}` fed to one signature call. TFRecord files use
the format of `tf.quantization.experimental.TfRecordRepresentativeDatasetSaver`.

Bad data never passes: a dataset with no samples, a float input holding NaN or inf, a
truncated TFRecord and an npz array of Python objects are errors naming the file. TF's
quantizer would calibrate on them anyway and report nothing.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import tensorflow as tf

from tpubuild.errors import StageError
from tpubuild.savedmodel.model import SavedModel

Sample = dict[str, np.ndarray]
# The converter's own advice: fewer samples than this calibrate poorly.
RECOMMENDED_SAMPLES = 200
# A TFRecord record: length (uint64) + its masked CRC32C (uint32), data, data CRC (uint32);
# kHeaderSize and kFooterSize in tensorflow/third_party/xla/xla/tsl/lib/io/record_reader.h.
_RECORD_HEADER, _RECORD_FOOTER = 12, 4


class InputSpec:
    """One signature input: name, numpy dtype and shape (None for unknown dimensions)."""

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int | None, ...] | None):
        self.name, self.dtype, self.shape = name, dtype, shape

    def describe(self) -> str:
        dims = "?" if self.shape is None else ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape)
        )


def signature_inputs(model: SavedModel, key: str) -> dict[str, InputSpec]:
    """The inputs of signature `key` by name; StageError naming the key when it is missing."""
    signature_defs = model.meta_graph.signature_def
    if key not in signature_defs:
        known = ", ".join(sorted(k for k in signature_defs if not k.startswith("__"))) or "none"
        raise StageError(f"{model.path}: no signature {key!r}; signatures: {known}")
    specs = {}
    for name, info in signature_defs[key].inputs.items():
        shape = None
        if not info.tensor_shape.unknown_rank:
            shape = tuple(None if d.size < 0 else d.size for d in info.tensor_shape.dim)
        specs[name] = InputSpec(name, np.dtype(tf.as_dtype(info.dtype).as_numpy_dtype), shape)
    return specs


def check_sample(sample: Any, specs: dict[str, InputSpec], where: str) -> Sample:
    """Return `sample` as arrays, or raise StageError naming the first input that does not fit."""
    if not isinstance(sample, dict):
        raise StageError(f"{where}: a sample must be a dict of input name -> array, got {type(sample).__name__}")
    missing = sorted(set(specs) - set(sample))
    unknown = sorted(set(sample) - set(specs))
    if unknown:
        raise StageError(
            f"{where}: input {unknown[0]!r} is not an input of the signature; its inputs: {', '.join(sorted(specs))}"
        )
    if missing:
        raise StageError(f"{where}: input {missing[0]!r} of the signature is missing from the sample")
    checked = {}
    for name, spec in sorted(specs.items()):
        value = np.asarray(sample[name])
        if value.dtype != spec.dtype:
            raise StageError(
                f"{where}: input {name!r} has dtype {value.dtype.name}, the signature wants {spec.describe()}"
            )
        if not spec.accepts_shape(value.shape):
            raise StageError(
                f"{where}: input {name!r} has shape {list(value.shape)}, the signature wants {spec.describe()}"
            )
        _require_finite(value, f"{where}: input {name!r}")
        checked[name] = value
    return checked


def _require_finite(value: np.ndarray, what: str, first_axis: str = "") -> None:
    """StageError when a float array holds NaN or inf: calibration ranges and verification
    errors computed over them are meaningless (a NaN range quantizes everything to NaN)."""
    if value.dtype.kind not in "fc" and value.dtype.name != "bfloat16":
        return
    as_float = value.astype(np.float32) if value.dtype.name == "bfloat16" else value
    finite = np.isfinite(as_float)
    if finite.all():
        return
    nan, inf = int(np.isnan(as_float).sum()), int(np.isinf(as_float).sum())
    where_first = ""
    if first_axis and value.ndim:
        first = int(np.argmin(finite.reshape(len(value), -1).all(axis=1)))
        where_first = f", the first in {first_axis} {first}"
    raise StageError(
        f"{what} holds non-finite values: {nan} NaN and {inf} inf of {value.size}{where_first}; "
        "calibration and verification need finite inputs"
    )


def npz_samples(path: Path, specs: dict[str, InputSpec], where: str) -> list[Sample]:
    """Samples from an npz archive: one array per input, first axis = samples.

    Sample i is `array[i]` when that has the signature's rank, else `array[i:i+1]`
    (a batch of one) so both unbatched and batched layouts work.
    """
    arrays = _npz_arrays(path, where)
    for name, array in sorted(arrays.items()):
        _require_finite(array, f"{where}: array {name!r}", "sample")
    counts = {name: len(a) if a.ndim else 0 for name, a in arrays.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in sorted(counts.items()))
        raise StageError(f"{where}: arrays disagree on the number of samples (first axis): {listed}")
    count = next(iter(counts.values()), 0)
    samples = []
    for i in range(count):
        sample = {}
        for name, array in arrays.items():
            spec = specs.get(name)
            wants_batch = spec is not None and spec.shape is not None and len(spec.shape) == array.ndim
            sample[name] = array[i : i + 1] if wants_batch else array[i]
        samples.append(check_sample(sample, specs, f"{where}: sample {i}"))
    if not samples:
        check_sample(dict(arrays), specs, where)  # names the missing input
        raise StageError(f"{where}: no samples (the arrays' first axis is empty)")
    return samples


def _npz_arrays(path: Path, where: str) -> dict[str, np.ndarray]:
    """Every array of an npz archive; StageError for an unreadable archive or an object array."""
    # Object arrays are pickles: never loaded (allow_pickle=False), so they fail here by name.
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise StageError(f"{where}: cannot read npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise StageError(f"{where}: not an npz archive (a single .npy array); save it with numpy.savez")
    arrays = {}
    with archive:
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError as exc:
                if "allow_pickle" in str(exc):
                    raise StageError(
                        f"{where}: array {name!r} holds Python objects (dtype object), which tpubuild "
                        "never unpickles; save numeric arrays"
                    ) from None
                raise StageError(f"{where}: cannot read array {name!r}: {exc}") from None
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise StageError(f"{where}: cannot read array {name!r}: {exc}") from None
    return arrays


def generator_samples(
    spec: str, module_file: Path, num_samples: int, specs: dict[str, InputSpec], where: str,
    workspace: Path | None = None,
) -> list[Sample]:
    """Call `module.path:function` (loaded from `module_file`) and take `num_samples` samples.
    `workspace`: a relative file it cannot open is said to be relative to its directory."""
    from tpubuild.user_code import missing_file_hint

    def hint(exc: BaseException) -> str:
        return missing_file_hint(exc, "generator", workspace) if workspace is not None else ""

    module_name, function_name = spec.split(":", 1)
    if not module_file.is_file():
        raise StageError(f"{where}: generator module file {module_file} does not exist")
    module_spec = importlib.util.spec_from_file_location(module_name, module_file)
    if module_spec is None or module_spec.loader is None:  # not a .py file importlib can load
        raise StageError(f"{where}: generator module file {module_file} is not a Python source file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # so the module's own pickling / dataclasses work
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise StageError(f"{where}: importing {module_file} failed: {type(exc).__name__}: {exc}{hint(exc)}") from None
    finally:
        sys.modules.pop(module_name, None)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise StageError(f"{where}: {module_file} has no function {function_name!r}")
    try:
        produced = list(itertools.islice(iter(function()), num_samples))
    except Exception as exc:
        raise StageError(f"{where}: generator {spec} raised {type(exc).__name__}: {exc}{hint(exc)}") from None
    if not produced:
        raise StageError(f"{where}: no samples (the generator yielded nothing)")
    return [check_sample(s, specs, f"{where}: sample {i}") for i, s in enumerate(produced)]


def write_tfrecord(path: Path, signature_key: str, samples: Iterable[Sample]) -> None:
    """Write samples in the format TF's quantizer reads (`tfrecord_file_path`)."""
    saver = tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(
        path_map={signature_key: str(path)}
    )
    saver.save({signature_key: list(samples)})


def read_tfrecord(path: Path, where: str) -> Iterator[Sample]:
    """Samples from a TFRecord file written by TfRecordRepresentativeDatasetSaver.

    StageError for a missing, empty, truncated or corrupted file, or a foreign record.
    """
    from tensorflow.compiler.mlir.quantization.tensorflow import (
        quantization_options_pb2,
    )

    if not path.is_file():
        raise StageError(f"{where}: representative dataset {path} does not exist")
    size = path.stat().st_size
    offset = 0  # where the next record starts
    try:
        for record in tf.data.TFRecordDataset(str(path)):
            data = record.numpy()
            offset += _RECORD_HEADER + len(data) + _RECORD_FOOTER
            sample = quantization_options_pb2.RepresentativeDataSample.FromString(data)
            yield {name: tf.make_ndarray(t) for name, t in sample.tensor_proto_inputs.items()}
    except tf.errors.DataLossError as exc:
        if "truncated record" in exc.message:
            raise StageError(_truncated(where, offset, size)) from None
        raise StageError(f"{where}: cannot read TFRecord {path}: {_first_line(exc.message)}") from None
    except tf.errors.OpError as exc:
        raise StageError(f"{where}: cannot read TFRecord {path}: {_first_line(exc.message)}") from None
    except Exception as exc:  # a record that is not a RepresentativeDataSample
        raise StageError(f"{where}: {path} is not a representative dataset TFRecord: {exc}") from None
    # TF's RecordReader::ReadChecksummed (record_reader.cc) reports a file cut inside a record's
    # 12-byte header as the end of the file: a truncated last record is dropped silently.
    if offset != size:
        raise StageError(_truncated(where, offset, size))
    if offset == 0:
        raise StageError(f"{where}: no samples (the TFRecord file is empty)")


def _truncated(where: str, offset: int, size: int) -> str:
    return f"{where}: truncated TFRecord: the record at byte {offset} runs past the end of the file ({size} bytes)"


def _first_line(message: str) -> str:
    """TF's op error without the eager wrapper around it (`{{function_node ...}}`, `[Op:...]`)."""
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:\w+\].*$", "", line)


def random_samples(specs: dict[str, InputSpec], count: int, seed: int) -> list[Sample]:
    """`count` seeded random samples fitting the signature (unknown dimensions become 1)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = {}
        for name, spec in sorted(specs.items()):
            shape = tuple(1 if d is None else d for d in (spec.shape or (1,)))
            if spec.dtype.kind == "f":
                value = rng.standard_normal(shape).astype(spec.dtype)
            elif spec.dtype.kind in "iu":
                value = rng.integers(0, 8, size=shape).astype(spec.dtype)
            elif spec.dtype.kind == "b":
                value = rng.integers(0, 2, size=shape).astype(bool)
            else:
                raise StageError(
                    f"cannot draw random samples for input {name!r} of dtype {spec.dtype.name}; "
                    "give a representative dataset"
                )
            sample[name] = value
        samples.append(sample)
    return samples


def dataset_paths(options: dict[str, Any], context: Any) -> dict[str, Path]:
    """Signature key -> TFRecord file: given ones from the workspace, generated ones from `dataset`."""
    paths = {}
    for key, source in sorted(options.get("representative_datasets", {}).items()):
        if "tfrecord_file_path" in source:
            paths[key] = context.workspace / source["tfrecord_file_path"]
        else:
            paths[key] = context.inputs["dataset"] / f"{key}.tfrecord"
    return paths
