"""verify of a batched model (batch_options): the artifact is called at every allowed batch
size on the samples grouped into batches, each compared with the source's outputs on every
sample alone, computed once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.stage_helpers import Runner
from tpubuild.errors import StageError

BATCH = {"num_batch_threads": 1, "max_batch_size": 4, "batch_timeout_micros": 0, "allowed_batch_sizes": [2, 4],
         "max_enqueued_batches": 10, "disable_large_batch_splitting": False,
         "experimental": {"signature_name": "serving_default"}}


class Model(tf.Module):
    def __init__(self, mixes_rows: bool) -> None:
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32))
        self.mixes_rows = mixes_rows

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x):
        y = tf.matmul(x, self.w)
        if self.mixes_rows:  # each row depends on the other rows of its batch: cannot be batched
            y = y - tf.reduce_mean(y, axis=0, keepdims=True)
        return {"y": y}


def _batched(runner: Runner, tmp_path: Path, mixes_rows: bool) -> Path:
    module = Model(mixes_rows)
    source = tmp_path / f"source-{mixes_rows}"
    tf.saved_model.save(module, str(source), signatures={"serving_default": module.serve})
    runner.inputs["source"] = source
    out, _ = runner.run("batch", source, {"tags": ["serve"], "tpu_functions": [], "batch_options": [BATCH]})
    return out


def _options() -> dict:
    # 5 samples: batches of 4 end with 1 real row padded by 3 copies of it, batches of 2 with 1.
    return {"tags": ["serve"], "applied": ["batch"], "representative_datasets": {}, "samples": 5, "seed": 0,
            "rtol": None, "atol": None, "batch_sizes": [2, 4]}


def test_a_batched_model_is_called_at_every_batch_size_and_passes(runner: Runner, tmp_path: Path) -> None:
    artifact = _batched(runner, tmp_path, mixes_rows=False)
    _, result = runner.run("verify", artifact, _options())
    summary = result.summary
    assert summary["passed"] is True and summary["tolerance"]["kind"] == "exact"
    sizes = summary["batch_calls"]["serving_default"]["sizes"]
    assert [(s["batch_size"], s["calls"], s["padded_rows"], s["passed"]) for s in sizes] == \
        [(2, 3, 1, True), (4, 2, 3, True)]
    [output] = summary["outputs"]
    assert output["elements"] == 10 and output["batch_size"] in (2, 4)
    assert "verify called the artifact in batches of 2, 4 rows" in runner.logged


def test_a_model_whose_rows_depend_on_their_batch_fails(runner: Runner, tmp_path: Path) -> None:
    """Alone (a batch of one, padded with copies of itself) its rows equal the source's: only
    batches of distinct samples show that a server's batching would change each answer."""
    artifact = _batched(runner, tmp_path, mixes_rows=True)
    with pytest.raises(StageError, match=r"^signature 'serving_default' output 'y' in batches of [24] rows differs "
                                         r"from the source: max abs error"):
        runner.run("verify", artifact, _options())
    # The same artifact, verified as before on each sample alone, passes: what this change catches.
    options = {k: v for k, v in _options().items() if k != "batch_sizes"}
    _, result = runner.run("verify", artifact, options)
    assert result.summary["passed"] is True and "batch_calls" not in result.summary
