"""Loaded before any test module: TensorFlow's own log lines stay out of the suite's log.

What a `tpubuild` command does for its user unless --debug (tpubuild/quiet.py) is done here
for the test processes, before whichever test module imports TensorFlow first (which depends
on the order xdist hands modules to a worker): TF_CPP_MIN_LOG_LEVEL=3 and tpubuild's quiet
flag go into the environment, read by this process and inherited by every subprocess a test
starts (the CLI, build workers, Ray and probe scripts), and this process's first
`import tensorflow` runs with file descriptor 2 captured, since the lines TensorFlow's
libraries log while they load ("oneDNN custom operations are on", "Could not find cuda
drivers", absl's "All log messages before absl::InitializeLog()") ignore that variable.

Users get what they got: the CLI quiets itself the same way, and tests that check what a user
sees run it with these variables removed (tests/convert/test_batch_quiet_cli.py).

Also here: the one build of the example workspace that tests of several packages read
(`built_examples`, `built_examples_run`), the example models exported once (`example_exports`),
and the tiny models the stage tests of verify/, report/, quantize/, diagnosis/, serving/ and
tpu/ share (`models`, `dense`, `two_tpu`, `two_tpu_placed`, `dense_placed`, `runner`; made by
tests/stage_helpers.py, which imports TensorFlow: imported in the fixtures, not here).

The tests are laid out by package like the code: tests/<package>/ holds the tests of
tpubuild/<package>/, tests/targets/<target>/ those of tpubuild/targets/<target>/, and a folder
named for a top-level module holds its tests (tests/render/: render.py; tests/convert/:
convert.py and the transforms/ stages its chain runs). Suites that cut across packages stay
as they are: tests/examples (the example workspace end to end, and the docs against the
code), tests/realmodels (real Keras, JAX and BERT models built) and tests/ray (builds on a Ray
cluster); test_layout.py and test_tiers.py here check the whole tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpubuild.quiet import quiet_tensorflow

if TYPE_CHECKING:
    from tests.stage_helpers import Runner

quiet_tensorflow()

# Session fixtures that the tests of one module share, each minutes of work or a live
# process: real-model builds, a Ray cluster, two TensorFlow processes exporting (one CI run
# saw them take 145 s on each worker, where 10-12 s is usual). Under `--dist loadgroup` (pyproject.toml's
# addopts) the tests using one of them run on one xdist worker, which makes it once, while
# the other worker runs other tests, rather than each worker making its own. (What tests of
# many modules read, the example workspace and the engine's built workspace, is made once per
# run under a file lock instead, tests/once.py: grouped, those modules would share a worker.)
GROUPED_FIXTURES = ("keras_built", "keras_exported", "keras_repo", "jax_built", "bert_workspace", "ray_address",
                    "reproducible_exports")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = [name for name in GROUPED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if used:
            item.add_marker(pytest.mark.xdist_group(used[0]))


@pytest.fixture(scope="session")
def built_examples_run(tmp_path_factory: pytest.TempPathFactory):
    """The example workspace after one `tpubuild build` of every recipe, with that build's
    --json document and stderr (tests/example_workspace.py): built once per test run, also
    under xdist (tests/once.py), about a minute of CPU. Tests copy it before changing anything."""
    from tests.example_workspace import build_examples, read_built_examples
    from tests.once import once_per_run

    return read_built_examples(once_per_run(tmp_path_factory, "examples_built", build_examples))


@pytest.fixture(scope="session")
def built_examples(built_examples_run) -> Path:
    """The built example workspace's root (a git repository, lock files committed)."""
    return built_examples_run.root


@pytest.fixture(scope="session")
def example_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"<script stem>:<function>" -> the SavedModel that export of the example workspace
    writes (tests/example_workspace.py), exported once per test run."""
    from tests.example_workspace import example_exports as exports
    from tests.example_workspace import export_examples
    from tests.once import once_per_run

    directory = once_per_run(tmp_path_factory, "example_exports", export_examples)
    return {key: directory / key for key in exports()}


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace-like root holding the exported models under models/."""
    from tests.stage_helpers import Dense, TwoTpu, save

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
    from tests.stage_helpers import Runner

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
