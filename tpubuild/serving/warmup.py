"""TF Serving warmup requests: `assets.extra/tf_serving_warmup_requests` in a SavedModel.

TF Serving replays this file when it loads a model, before it serves
(tensorflow_serving/servables/tensorflow/saved_model_warmup.h, `RunSavedModelWarmup`):
a TFRecord file of serialized `PredictionLog` protos, at most
`WarmupConsts::kMaxNumRecords` = 1000 of them, named `WarmupConsts::kRequestsFileName`
under `assets.extra/` (tensorflow/cc/saved_model/constants.h
`kSavedModelAssetsExtraDirectory`). A TPU compiles one program per input shape, so one
request per signature and per batch size the server will form makes every compilation
happen at load time instead of on a user's first requests.

The requests are built from samples (the representative dataset, else seeded random
inputs, the same ones verify runs), so the same inputs give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ASSETS_EXTRA = "assets.extra"
REQUESTS_FILE = "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # WarmupConsts::kMaxNumRecords
MODEL_NAME = "model"  # TF Serving matches requests to the loading model whatever its name
# What warmup may hold in memory: one request (each is written as it is made), and all of
# them (the file TF Serving reads). Ours, not TF Serving's: it reads each record as one protobuf
# message, whose hard limit is 2 GiB; a request this large compiles nothing a smaller
# one of the same shape would not, and validate bounds batch sizes (config/checks.py
# MAX_BATCH_SIZE), so only very wide inputs reach these.
MAX_REQUEST_BYTES = 256 << 20
MAX_TOTAL_BYTES = 1 << 30


def warmup_path(saved_model_dir: Path) -> Path:
    """Where TF Serving looks for the warmup requests of a SavedModel."""
    return Path(saved_model_dir) / ASSETS_EXTRA / REQUESTS_FILE


def batch_rows(samples: list[dict[str, np.ndarray]], size: int) -> dict[str, np.ndarray]:
    """One batch of `size` rows, taken in order from the samples (cycling), each sample's
    rows along dimension 0. Each input is allocated once, at its final size."""
    return _taken(_sample_rows(samples), size)


def _taken(pool: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """`size` rows of each input of `pool` (every sample's rows, _sample_rows), cycling."""
    import numpy as np

    rows = next(iter(pool.values())).shape[0] if pool else 0
    if pool and rows == 0:
        raise ValueError("the samples hold no rows")
    index = np.arange(size) % max(rows, 1)
    return {name: np.take(value, index, axis=0) for name, value in pool.items()}


def _sample_rows(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Every sample's rows, in order, per input."""
    import numpy as np

    names = list(samples[0]) if samples else []
    return {name: np.concatenate([_batched(name, sample[name]) for sample in samples], axis=0) for name in names}


def _batched(name: str, value: Any) -> np.ndarray:
    """A sample's input as an array batched along dimension 0; a scalar (no rows to
    batch) is a ValueError naming the input, where numpy's concatenate and shape[0]
    would each fail their own way."""
    import numpy as np

    array = np.asarray(value)
    if array.ndim == 0:
        raise ValueError(f"sample input {name!r} is a scalar; a warmup request batches samples along dimension 0")
    return array


def request_bytes(samples: list[dict[str, np.ndarray]], size: int) -> int:
    """What batch_rows(samples, size) will allocate, known before it does (from the
    samples' sizes: nothing is concatenated to learn it)."""
    import numpy as np

    names = list(samples[0]) if samples else []
    total = 0
    for name in names:
        values = [_batched(name, sample[name]) for sample in samples]
        rows = sum(value.shape[0] for value in values)
        total += sum(value.nbytes for value in values) // max(rows, 1) * size
    return total


def requests(samples_by_key: dict[str, list[dict[str, np.ndarray]]], batch_sizes: dict[str, list[int]],
             max_records: int) -> Iterator[Any]:
    """One PredictionLog per signature and batch size, in sorted order, each made when the
    one before it has been taken. Checked before the first is made: a ValueError now, not
    after half the file was written."""
    count = sum(len(sizes) for sizes in batch_sizes.values())
    limit = min(max_records, MAX_RECORDS)
    if count > limit:
        raise ValueError(f"{count} warmup requests (one per signature and batch size) exceed the limit of {limit}; "
                         "lower the batch sizes or raise warmup.max_records")
    total = 0
    for key in sorted(batch_sizes):
        for size in sorted(batch_sizes[key]):
            need = request_bytes(samples_by_key[key], size)
            total += need
            if need > MAX_REQUEST_BYTES or total > MAX_TOTAL_BYTES:
                what = (f"the request of signature {key!r} for batch size {size} would hold {need / 2**20:.0f} MiB, "
                        f"more than {MAX_REQUEST_BYTES >> 20} MiB" if need > MAX_REQUEST_BYTES else
                        f"the requests would hold more than {MAX_TOTAL_BYTES >> 20} MiB in all")
                raise ValueError(f"{what}; lower the batch sizes, or `warmup: {{enabled: false}}`")
    return _made(samples_by_key, batch_sizes)


def _made(samples_by_key: dict[str, list[dict[str, np.ndarray]]], batch_sizes: dict[str, list[int]]) -> Iterator[Any]:
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    for key in sorted(batch_sizes):
        pool = _sample_rows(samples_by_key[key])  # once per signature, for all its batch sizes
        for size in sorted(batch_sizes[key]):
            request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=MODEL_NAME, signature_name=key))
            for name, value in sorted(_taken(pool, size).items()):
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            yield prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def write(saved_model_dir: Path, logs: Iterable[Any]) -> list[str]:
    """Write the requests as TF Serving reads them: a TFRecord file of PredictionLog, each
    request let go once written; returns each one's line (describe). The directory is a
    stage's fresh output, moved into the store whole by the engine."""
    import tensorflow as tf

    path = warmup_path(saved_model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    described = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for log in logs:
            writer.write(log.SerializeToString(deterministic=True))
            described.append(describe(log))
    return described


def read(saved_model_dir: Path) -> list[Any]:
    """The warmup requests of a SavedModel ([] when it has none)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = warmup_path(saved_model_dir)
    if not path.is_file():
        return []
    return [prediction_log_pb2.PredictionLog.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(str(path))]


def describe(log: Any) -> str:
    """One line per request: kind, signature, and each input's dtype and shape."""
    import tensorflow as tf

    kind = log.WhichOneof("log_type")
    if kind != "predict_log":
        return f"{kind} (not a predict request)"
    request = log.predict_log.request
    inputs = ", ".join(
        f"{name} {tf.dtypes.as_dtype(t.dtype).name}[{','.join(str(d.size) for d in t.tensor_shape.dim)}]"
        for name, t in sorted(request.inputs.items())
    )
    return f"predict {request.model_spec.signature_name}: {inputs}"


def replay(saved_model_dir: Path, tags: list[str], logs: list[Any]) -> list[dict[str, tuple[int, ...]]]:
    """Run each request as TF Serving's warmup does (its signature, its inputs) on a
    SavedModel that runs here (a CPU SavedModel or a TPU artifact's CPU twin); returns
    each request's output shapes. A request naming an unknown signature or input raises."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model_dir), tags=tags)
    shapes = []
    for log in logs:
        request = log.predict_log.request
        function = loaded.signatures[request.model_spec.signature_name]
        feed = {name: tf.constant(tf.make_ndarray(t)) for name, t in request.inputs.items()}
        outputs = function(**feed)
        shapes.append({name: tuple(value.shape) for name, value in outputs.items()})
    return shapes
