"""A SavedModel with a sharded checkpoint (`variables.data-0000K-of-0000M`, M > 1, written
by TensorFlow's `experimental_sharding_callback`) through `tpubuild build`: source, tpu,
bfloat16 (the checkpoint rewritten tensor by tensor, each in its shard), verify, publish;
the published artifact loads and runs, and keeps the source's shard count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.cli import tpubuild
from tests.tolerances import BFLOAT16, REORDERED, assert_close, computes_in
from tpubuild.savedmodel import tensor_bundle
from tpubuild.tpu.twin import make_cpu_twin

RECIPE = """\
name: sharded
model: {saved_model: models/sharded}
converter:
  tpu_functions: [{function_alias: tpu_func}]
  bfloat16_optimization_options: {scope: ALL}
verify: {samples: 4, rtol: 0.05}
"""
# The same, its published checkpoint resharded into files of at most 1 MiB (the reshard stage).
RESHARDED = RECIPE.replace("name: sharded", "name: resharded") + "variables: {max_shard_size: 1MiB}\n"


N = 512  # 1 MiB float32 kernels


class Placed(tf.Module):
    """Four float32 layers under the alias `tpu_func`, an int64 table beside them."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(11)
        self.kernels = [tf.Variable(rng.normal(scale=0.05, size=(N, N)).astype(np.float32)) for _ in range(4)]
        self.offsets = tf.Variable(np.arange(N, dtype=np.int64))

    @tf.function(input_signature=[tf.TensorSpec([None, N], tf.float32)])
    def tpu_func(self, x):
        for kernel in self.kernels:
            x = tf.tanh(tf.matmul(x, kernel))
        return x

    @tf.function(input_signature=[tf.TensorSpec([None, N], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 0.01 * tf.cast(self.offsets, tf.float32)}


def _data_files(model: Path) -> list[str]:
    return sorted(p.name for p in (model / "variables").iterdir() if ".data-" in p.name)


@pytest.mark.slow
def test_a_sharded_model_builds_and_keeps_its_shards(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "recipes").mkdir(parents=True)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    (ws / "recipes" / "sharded.yaml").write_text(RECIPE)
    (ws / "recipes" / "resharded.yaml").write_text(RESHARDED)
    source = ws / "recipes" / "models" / "sharded"
    model = Placed()
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=300_000)  # 1 MiB kernels: sliced across shards
    tf.saved_model.save(model, str(source), signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func},
                                                           experimental_sharding_callback=policy))
    shards = _data_files(source)
    assert len(shards) > 4, shards

    done = tpubuild(ws, "build", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    stages = {row["stage"]: row["status"] for row in json.loads(done.stdout)["rows"] if row["recipe"] == "sharded"}
    assert {"source", "tpu", "bfloat16", "verify"} <= set(stages), stages

    published = ws / "out" / "sharded" / "1"
    assert _data_files(published) == shards  # the source's shard count, the same names
    with tensor_bundle.Reader.open(source / "variables" / "variables") as src, \
            tensor_bundle.Reader.open(published / "variables" / "variables") as out:
        assert sorted(out.entries) == sorted(src.entries)
        assert {k: e.shard_id for k, e in out.entries.items()} == {k: e.shard_id for k, e in src.entries.items()}
        assert any(e.slices for e in out.entries.values())  # the kernels still sliced
    reader = tf.train.load_checkpoint(str(published / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["kernels/0/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    assert dtypes["offsets/.ATTRIBUTES/VARIABLE_VALUE"] == tf.int64

    report = json.loads((published / "tpubuild-report.json").read_text())
    assert report["verify"]["passed"] is True
    # The artifact loads (TensorFlow's reader assembling the slices from the shards) and
    # runs: its CPU twin (TPU calls made ordinary calls, bfloat16 kept) beside the source.
    make_cpu_twin(published, tmp_path / "twin")
    x = tf.constant(np.random.default_rng(5).normal(size=(3, N)).astype(np.float32))
    got = tf.saved_model.load(str(tmp_path / "twin")).signatures["serving_default"](x=x)["y"].numpy()
    want = tf.saved_model.load(str(source)).signatures["serving_default"](x=x)["y"].numpy()
    assert computes_in(published) == "bfloat16"
    assert_close(got, want, BFLOAT16)  # four tanh layers rounded to bfloat16: within BFLOAT16's bound
    # A C++-style load (TF Serving's) runs the graph's own restore function instead: its
    # RestoreV2 reads the full tensors from the slices in the shards, as bfloat16.
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(tmp_path / "twin"))
        signature = meta.signature_def["serving_default"]
        served = session.run(signature.outputs["y"].name, {signature.inputs["x"].name: x.numpy()})
    assert_close(served, got, REORDERED["bfloat16"])  # the same bfloat16 computation, run by a session

    # variables.max_shard_size: the reshard stage ran after bfloat16, before verify, which passed.
    resharded = ws / "out" / "resharded" / "1"
    rows = {row["stage"]: row["status"] for row in json.loads(done.stdout)["rows"] if row["recipe"] == "resharded"}
    assert list(rows).index("bfloat16") < list(rows).index("reshard") < list(rows).index("verify"), rows
    report = json.loads((resharded / "tpubuild-report.json").read_text())
    assert report["verify"]["passed"] is True
    assert report["stages"]["reshard"]["shards"] == len(_data_files(resharded))
    assert "Checkpoint: " in (resharded / "tpubuild-report.md").read_text()
    files = _data_files(resharded)
    sizes = [(resharded / "variables" / name).stat().st_size for name in files]
    assert 1 < len(files) < len(shards) and max(sizes) <= 1 << 20, (files, sizes)
    ours = tf.train.load_checkpoint(str(resharded / "variables" / "variables"))
    for name in dtypes:  # the same values as the artifact that kept the source's shards
        assert np.asarray(ours.get_tensor(name)).tobytes() == np.asarray(reader.get_tensor(name)).tobytes()
