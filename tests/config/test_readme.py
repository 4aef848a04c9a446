"""The README's quick start and recipe examples, and the reference recipe of docs/recipes.md,
taken from the pages themselves."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPO, tpubuild
from tpubuild.config.recipe import load_recipe_file

README = (REPO / "README.md").read_text()
RECIPES = (REPO / "docs" / "recipes.md").read_text()


def _block(section: str, language: str, page: str = README) -> str:
    """The first ```language block after the heading `section` of `page`."""
    after = page[page.index(f"\n## {section}\n"):]
    return re.search(rf"```{language}\n(.*?)```", after, re.S).group(1)


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory) -> Path:
    """The quick start run word for word in a new directory, but for `tpubuild build`:
    that one runs TensorFlow for half a minute (tests/engine build real models)."""
    script = "\n".join(line for line in _block("Quick start", "sh").splitlines() if not line.startswith("tpubuild build"))
    assert "tpubuild build" in _block("Quick start", "sh")
    cwd = tmp_path_factory.mktemp("quickstart")
    # `tpubuild` is this checkout's, whatever the PATH holds.
    shim = f'tpubuild() {{ "{sys.executable}" -m tpubuild "$@"; }}\nset -e\n'
    done = subprocess.run(["bash", "-c", shim + script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    root = cwd / "my-models"
    # `tpubuild init` first: the files it made, and nothing of the build will reach git.
    assert done.stdout.startswith("created tpubuild.yaml\ncreated recipes/\ncreated .tpubuild/.gitignore "), done.stdout
    assert (root / ".gitignore").read_text().endswith("\n/out/\n")
    assert done.stdout[done.stdout.index("1 recipe OK"):].startswith(
        f"1 recipe OK in {root}\n"
        "toy  recipes/toy.py:export  [export > tpu > bfloat16 > io_shape > batch > warmup > verify > report > publish]\n"
        'tpu_functions {\n  function_alias: "tpu_func"\n}\n'
    ), done.stdout
    return root


def test_quick_start_works_word_for_word(quick_start):
    recipe = load_recipe_file(quick_start / "recipes" / "toy.yaml")
    assert recipe.canonical["model"]["export"] == {"script": "recipes/toy.py", "function": "export", "deps": []}


def test_recipe_example_validates_as_written(quick_start, tmp_path):
    example = _block("Recipe format", "yaml", RECIPES)
    assert "saved_model" in example and "quantization_options" in example  # the full reference
    workspace = shutil.copytree(quick_start, tmp_path / "my-models")  # the fixture stays as the quick start left it
    path = workspace / "recipes" / "toy.yaml"
    path.write_text(example)
    recipe = load_recipe_file(path)
    assert recipe.name == "toy"
    converter = recipe.canonical["converter"]
    assert converter["batch_options"][0]["allowed_batch_sizes"] == [2, 4, 8]
    assert converter["bfloat16_optimization_options"]["filterlist"] == ["Softmax"]
    assert recipe.canonical["verify"]["rtol"] == 0.02


def test_the_readme_recipe_in_brief_validates_in_the_quick_start_workspace(quick_start, tmp_path):
    workspace = shutil.copytree(quick_start, tmp_path / "my-models")
    path = workspace / "recipes" / "toy.yaml"
    path.write_text(_block("Recipes in brief", "yaml"))
    recipe = load_recipe_file(path)
    assert sorted(recipe.canonical["targets"]) == ["cpu_savedmodel", "litert", "tpu_savedmodel", "xla_aot"]
    assert recipe.canonical["converter"]["bfloat16_optimization"] == "ENABLED"


def test_readme_states_the_export_contract():
    assert "`function(output_dir: str)`" in README
    assert "must write a TF2 SavedModel" in README


def test_schema_lines_work_in_the_users_workspace(quick_start, tmp_path):
    """The reference recipe's `$schema` lines name files that exist in the quick start's workspace
    once `tpubuild schema` wrote them (issue 30 item 10)."""
    import json

    workspace = shutil.copytree(quick_start, tmp_path / "my-models")
    run = lambda *argv: tpubuild(workspace, *argv, timeout=60, code=0).stdout
    installed = Path(run("schema").strip())
    assert installed.name == "recipe.schema.json" and installed.is_absolute()
    (workspace / "recipe.schema.json").write_text(run("schema", "--content"))  # as the README says
    assert json.loads((workspace / "recipe.schema.json").read_text()) == json.loads(installed.read_text())
    for line in (_block("Recipe format", "yaml", RECIPES).splitlines()[0], run("schema", "--modeline").strip()):
        target = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", line).group(1)
        assert json.loads((workspace / "recipes" / target).read_text())["$id"].endswith("/recipe.schema.json"), line
    assert Path(run("schema", "workspace").strip()).name == "workspace.schema.json"
