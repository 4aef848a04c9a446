"""The two tiers of the suite (pyproject.toml addopts, README): plain `pytest` deselects the
tests marked `slow`, `pytest -m slow` (which .ci/run runs after it) selects them.

Read from the syntax trees, without collecting (collection imports TensorFlow): every
folder of tests keeps tests in the default tier, so the README's command covers every
package; and the slow tier is not empty, so CI's `pytest -m slow` never exits 5 ("no
tests ran").
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` (or a list holding it, as a module's `pytestmark`)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(e) for e in node.elts)
    return ast.unparse(node) == "pytest.mark.slow"


def tiers_of(path: Path) -> tuple[list[str], list[str]]:
    """(default-tier tests, slow tests) of one test module, by function name."""
    tree = ast.parse(path.read_text(), str(path))
    module_slow = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                         for t in n.targets) and _is_slow_mark(n.value)
                      for n in tree.body)
    fast, slow = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            is_slow = module_slow or any(_is_slow_mark(d) for d in node.decorator_list)
            (slow if is_slow else fast).append(node.name)
    return fast, slow


def test_every_folder_of_tests_keeps_tests_in_the_default_tier() -> None:
    folders = {p.parent for p in TESTS.rglob("test_*.py")}
    assert len(folders) > 10
    without = sorted(str(folder.relative_to(TESTS.parent)) for folder in folders
                     if not any(tiers_of(p)[0] for p in folder.glob("test_*.py")))
    assert without == []


def test_the_slow_tier_holds_tests() -> None:
    slow = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py") if tiers_of(p)[1]}
    assert {"realmodels/test_keras_models.py", "ray/test_ray_build.py", "publish/test_publish_races.py"} <= slow


def test_the_tiers_are_read_from_marks_and_pytestmark(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("import pytest\n\n@pytest.mark.slow\n@pytest.mark.parametrize('a', [1])\ndef test_a(a): pass\n\n"
                      "def test_b(): pass\n")
    assert tiers_of(module) == (["test_b"], ["test_a"])
    module.write_text("import pytest\npytestmark = [pytest.mark.slow]\n\ndef test_b(): pass\n")
    assert tiers_of(module) == ([], ["test_b"])


def test_a_grouped_fixture_keeps_its_tests_on_one_worker(tmp_path: Path) -> None:
    """issue 49 item 2: the tests using one of tests/conftest.py's GROUPED_FIXTURES run on one
    xdist worker, which makes the fixture once (a real-model build: minutes). Run as the suite
    runs (`-n 2 --dist loadgroup`, conftest.py's own hook) on six tests of one such fixture."""
    import os
    import subprocess
    import sys

    from tests.cli import REPO

    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_grouped.py").write_text(
        "import os\nimport pytest\n\n\n@pytest.fixture(scope='session')\ndef jax_built():\n"
        "    return os.environ['PYTEST_XDIST_WORKER']\n\n\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_one(jax_built, i, tmp_path_factory):\n"
        "    (tmp_path_factory.getbasetemp().parent / f'{i}.worker').write_text(jax_built)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                           "--rootdir", str(tmp_path), "-n", "2", "--dist", "loadgroup",
                           "--basetemp", str(tmp_path / "run"), str(tmp_path / "test_grouped.py")],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.read_text() for path in (tmp_path / "run").glob("*.worker")}
    assert len(list((tmp_path / "run").glob("*.worker"))) == 6 and len(workers) == 1, workers
