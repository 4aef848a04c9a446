"""The warmup stage on inputs it cannot fill: a default must not fail a build that works,
a `warmup:` section that asked for it must."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from tests.stage_helpers import Runner
from tpubuild.errors import StageError
from tpubuild.serving import warmup


class Lengths(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        return {"length": tf.strings.length(text)}


@pytest.fixture(scope="module")
def strings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("strings") / "model"
    module = Lengths()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def options(requested: bool) -> dict:
    return {"tags": ["serve"], "batch_sizes": [2, 4], "max_records": 1000, "requested": requested,
            "samples": 4, "seed": 0, "representative_datasets": {}}


def test_a_default_warmup_without_samples_it_can_make_is_a_warning(runner: Runner, strings: Path) -> None:
    out, result = runner.run("warmup", strings, options(requested=False))
    assert not warmup.warmup_path(out).exists()
    [warning] = result.warnings
    assert warning.startswith("warmup: no warmup requests written: signature 'serving_default': ")
    assert "`warmup: {enabled: false}`" in warning


def test_a_requested_warmup_without_samples_fails_in_one_line(runner: Runner, strings: Path) -> None:
    with pytest.raises(StageError) as failure:
        runner.run("warmup", strings, options(requested=True))
    assert str(failure.value).startswith("warmup: signature 'serving_default': ")
    assert "\n" not in str(failure.value)
