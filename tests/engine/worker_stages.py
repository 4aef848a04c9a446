"""Two stage functions for tests/engine/test_worker_isolation.py, run by real workers: one
that only imports TensorFlow (as the proto-rewriting stages do), one that loads and runs a
SavedModel (as verify and report do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages.base import StageResult


def imports_tensorflow(input_dir: Path, output_dir: Path, options: dict[str, Any], context: Any) -> StageResult:
    import tensorflow as tf  # noqa: F401

    return StageResult(summary={})


def runs_a_model(input_dir: Path, output_dir: Path, options: dict[str, Any], context: Any) -> StageResult:
    import tensorflow as tf

    model = tf.saved_model.load(str(input_dir))
    value = float(model.signatures["serving_default"](x=tf.constant([[1.0, 2.0]]))["y"].numpy().sum())
    del model
    return StageResult(summary={"value": value})
