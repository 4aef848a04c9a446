"""Session-scoped tiny SavedModels shared by the quality tests (exported once per run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from quality_helpers import Dense, Runner, TwoTpu, save


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace-like root holding the exported models under models/."""
    root = tmp_path_factory.mktemp("quality")
    save(Dense(), root / "models" / "dense")
    # The same model with its serving function also saved under an alias: placed by
    # signature or by alias, the TPU runs the same computation.
    aliased = Dense()
    save(aliased, root / "models" / "dense_aliased", {"serve": aliased.serve})
    two = TwoTpu()
    save(two, root / "models" / "two_tpu", {"tpu_func_1": two.tpu_func_1, "tpu_func_2": two.tpu_func_2})
    return root


@pytest.fixture(scope="session")
def dense(models: Path) -> Path:
    return models / "models" / "dense"


@pytest.fixture(scope="session")
def two_tpu(models: Path) -> Path:
    return models / "models" / "two_tpu"


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    """A per-test workspace root (for dataset files) and stage output area."""
    (tmp_path / "ws").mkdir()
    return Runner(tmp_path / "ws", tmp_path / "out")


@pytest.fixture(scope="session")
def two_tpu_placed(models: Path) -> Path:
    """two_tpu with both aliases placed on the TPU by the real placement code."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.functions import resolve_tpu_functions
    from tpubuild.tpu.placement import place_on_tpu

    model = SavedModel.load(models / "models" / "two_tpu", ["serve"])
    functions = resolve_tpu_functions(model, [{"function_alias": "tpu_func_1"}, {"function_alias": "tpu_func_2"}])
    place_on_tpu(model, functions)
    out = models / "placed" / "two_tpu"
    out.mkdir(parents=True)
    model.save(out)
    return out


@pytest.fixture(scope="session")
def dense_placed(models: Path) -> dict[str, Path]:
    """dense_aliased placed by `signature_name: serving_default` (the signature's body split
    from it, as for Keras's model.export()) and by `function_alias: serve`."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.functions import resolve_tpu_functions
    from tpubuild.tpu.placement import place_on_tpu

    placed = {}
    for how, entry in (("signature", {"signature_name": "serving_default"}), ("alias", {"function_alias": "serve"})):
        model = SavedModel.load(models / "models" / "dense_aliased", ["serve"])
        place_on_tpu(model, resolve_tpu_functions(model, [entry]))
        placed[how] = models / "placed" / f"dense_by_{how}"
        placed[how].mkdir(parents=True)
        model.save(placed[how])
    return placed
