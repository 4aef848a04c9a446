"""Session-scoped tiny real SavedModels shared by the savedmodel tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from sm_models import ALIASES, SIGNATURES, F, Jit, Zoo


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def zoo(models_dir: Path) -> Path:
    model = Zoo()
    path = models_dir / "zoo"
    tf.saved_model.save(
        model,
        str(path),
        signatures={key: getattr(model, method) for key, method in SIGNATURES.items()},
        options=tf.saved_model.SaveOptions(function_aliases={a: getattr(model, a) for a in ALIASES}),
    )
    return path


@pytest.fixture(scope="session")
def jit(models_dir: Path) -> Path:
    model = Jit()
    path = models_dir / "jit"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


@pytest.fixture(scope="session")
def tf1_model(models_dir: Path) -> Path:
    path = models_dir / "tf1"
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, F], name="x")
        y = tf.identity(x * 2.0, name="y")
        with tf.compat.v1.Session() as session:
            builder = tf.compat.v1.saved_model.Builder(str(path))
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], {"serving_default": signature})
            builder.save()
    return path


@pytest.fixture(scope="session")
def inputs() -> tf.Tensor:
    return tf.constant(np.random.default_rng(1).normal(size=(3, F)).astype("float32"))
