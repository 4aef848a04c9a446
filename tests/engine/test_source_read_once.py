"""Issue 54 item 2, the source read once: a build copies the source's large files into the
cache as it hashes them for the source's key (store/staging.py); the source step moves the
copies in. A real SavedModel, a real build, the published model loaded and run."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.cli import tpubuild
from tests.engine.conftest import build_json, source_recipe, write_workspace

ROWS = 1280  # a [1280, 1024] float32 variable: 5 MiB, over staging.py's STAGED_MIN_SIZE
VARIABLES = "recipes/models/tiny/variables/variables.data-00000-of-00001"


@pytest.fixture(scope="module")
def wide_saved_model(tmp_path_factory):
    """`y = x @ w` behind the converter guide's `tpu_func` alias, `w` 5 MiB of weights."""
    import tensorflow as tf

    class Placed(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([2, ROWS * 512], seed=[1, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def tpu_func(self, x):
            return tf.matmul(x, self.w)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": self.tpu_func(x)}

    path = tmp_path_factory.mktemp("wide") / "model"
    model = Placed()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}))
    return path


def _source_row(document: dict) -> dict:
    [row] = [r for r in document["rows"] if r["stage"] == "source"]
    return row


def _staged_left(ws) -> list[str]:
    return [p.name for p in (ws / ".tpubuild").rglob("*.staged")]


def test_a_cold_build_reads_the_source_once_and_publishes_its_bytes(tmp_path, wide_saved_model):
    ws = write_workspace(tmp_path / "ws", wide_saved_model, {"toy": source_recipe("toy")})
    data = (ws / VARIABLES).read_bytes()
    assert len(data) >= 5 << 20
    past = time.time() - 60  # older than the stat cache's racy window: one read, not two
    os.utime(ws / VARIABLES, (past, past))
    document = build_json(ws)
    row = _source_row(document)
    assert row["status"] == "built"
    # Its row says what staging read and wrote while the key was taken, the file once (that
    # the step reads none of the user's file again: tests/store/test_source_staging.py).
    assert len(data) <= row["io"]["rchar"] < 1.5 * len(data), row["io"]
    assert row["io"]["wchar"] >= len(data), row["io"]
    assert _staged_left(ws) == []
    published = ws / "out" / "toy" / "1"
    [stored] = [p for p in published.rglob("variables.data-*") if "tpu" not in p.parts[-3:-1]]
    assert stored.read_bytes() == data

    import tensorflow as tf

    loaded = tf.saved_model.load(str(published))
    x = np.array([[1.0, 2.0]], np.float32)
    source = tf.saved_model.load(str(wide_saved_model))
    expected = source.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    # The same weights, the same matmul on this CPU, maybe batched otherwise: a few ulps.
    np.testing.assert_allclose(loaded.signatures["serving_default"](x=tf.constant(x))["y"].numpy(), expected,
                               rtol=1e-5, atol=1e-5)


def test_a_touched_source_is_hashed_and_its_copy_dropped(tmp_path, wide_saved_model):
    """The same bytes under a new mtime: hashed (and copied) again for the key, the source
    is cached, and the copy does not outlive the build."""
    ws = write_workspace(tmp_path / "ws", wide_saved_model, {"toy": source_recipe("toy")})
    build_json(ws)
    later = time.time() - 30
    os.utime(ws / VARIABLES, (later, later))
    again = build_json(ws)
    assert {r["status"] for r in again["rows"]} == {"cached"}, again["rows"]
    assert _staged_left(ws) == []
    assert tpubuild(ws, "build", code=0).stdout.endswith("cached\n")
