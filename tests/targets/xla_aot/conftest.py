"""One tiny model compiled once per session by the real xla_aot stage, and verified once
(the model and the stage calls are in xla_aot_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xla_aot_models import build, save, verify

from tpubuild.stages.base import StageResult


@pytest.fixture(scope="session")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tmp_path_factory.mktemp("xla_aot_model") / "recurrent")


@pytest.fixture(scope="session")
def workspace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the XLA AOT runtime's objects are cached: pytest's cache directory when there is
    one, so the runtime is compiled once per checkout (~25 s), not once per session."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("tpubuild_xla_aot_workspace")) if cache else tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="session")
def artifact(source: Path, workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StageResult]:
    out = tmp_path_factory.mktemp("xla_aot") / "out"
    return out, build(source, out, workspace)


@pytest.fixture(scope="session")
def verified(source: Path, artifact: tuple[Path, StageResult], workspace: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StageResult]:
    out = tmp_path_factory.mktemp("xla_aot_verify")
    return out, verify(source, artifact[0], out, workspace)
