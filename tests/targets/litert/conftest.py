"""Session-scoped tiny SavedModels and builds shared by the LiteRT target's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.targets.litert.litert_helpers import (
    DynamicBatch,
    Runner,
    TwoSignatures,
    Unary,
    example_module,
    flex_only,
    no_kernel,
    save,
    scaled_tanh,
    unknown_composite,
)
from tpubuild.stages.base import StageResult

IDS_DATASET = "data/ids.tfrecord"


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace root holding the exported models and the representative dataset."""
    root = tmp_path_factory.mktemp("litert")
    example = example_module()
    example.export(str(root / "models" / "example"))
    example.export(str(root / "models" / "other"), seed=7)  # same shapes, other weights
    save(DynamicBatch(example), root / "models" / "dynamic_batch")
    save(Unary(flex_only), root / "models" / "flex")
    save(Unary(no_kernel), root / "models" / "no_kernel")
    save(Unary(scaled_tanh), root / "models" / "fusable")
    save(Unary(unknown_composite), root / "models" / "unknown_composite")
    two = TwoSignatures()
    save(two, root / "models" / "two_signatures", {"project": two.project, "squash": two.squash})
    from tpubuild.quantize.datasets import write_tfrecord

    rng = np.random.default_rng(5)
    (root / "data").mkdir()
    ids = [{"ids": rng.integers(0, example.VOCAB, size=(example.BATCH, example.STEPS)).astype(np.int32)} for _ in range(64)]
    write_tfrecord(root / IDS_DATASET, "serving_default", ids)
    return root


@pytest.fixture(scope="session")
def runner(workspace: Path) -> Runner:
    return Runner(workspace, workspace / "out")


@pytest.fixture(scope="session")
def example(workspace: Path) -> Path:
    return workspace / "models" / "example"


@pytest.fixture(scope="session")
def fused(runner: Runner, example: Path) -> tuple[Path, StageResult]:
    """The example converted with every composite kept (the defaults)."""
    return runner.build(example)


@pytest.fixture(scope="session")
def unfused(runner: Runner, example: Path) -> tuple[Path, StageResult]:
    return runner.build(example, {"composites": "none"})
