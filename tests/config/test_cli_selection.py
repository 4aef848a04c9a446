"""Recipe targets like make's and bazel's (issue 30 items 5 and 7): a recipe file works
wherever a name does, an invalid recipe not asked for does not stop the others, building
zero recipes says why, and every usage error exits 2. In-process CLI runs on tiny
workspaces; nothing here builds a model or imports TensorFlow."""

from __future__ import annotations

import json

import pytest

GOOD = "model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions: [{function_alias: f}]\n"
BAD = "model: {saved_model: ../models/toy}\nconverter:\n  batch_options: [{max_batch_size: -1}]\nverfy: {}\n"
BAD_FIRST = "recipes/bad.yaml:3:36: converter.batch_options[0].max_batch_size: must be >= 1, got -1"
BAD_SECOND = "recipes/bad.yaml:4:1: verfy: unknown key 'verfy' (did you mean 'verify'?)"
# The one line an invalid recipe that was not asked for gets.
BAD_WARNING = (f"warning: recipes/bad.yaml:3:36: invalid recipe 'bad' skipped: converter.batch_options[0]."
               "max_batch_size: must be >= 1, got -1 (+1 more: tpubuild validate recipes/bad.yaml)\n")
TOY_STAGES = ("source", "tpu", "bfloat16", "io_shape", "verify", "report", "publish")


def dry_run_plan(out: str) -> list[str]:
    """`build --dry-run`'s rows of a never-built toy, without their reasons (explain's words)."""
    return [line.split(" (", 1)[0] for line in out.splitlines()]


TOY_DRY_RUN = [f"toy: {stage}: would run" for stage in TOY_STAGES] + ["1 recipe: 7 would run"]


@pytest.fixture
def toy(ws):
    ws.write("recipes/toy.yaml", GOOD)
    return ws


@pytest.mark.parametrize("verb", [["validate"], ["list"], ["render"], ["explain"], ["build", "--dry-run"]])
def test_a_recipe_file_works_wherever_a_name_does(toy, monkeypatch, verb):
    by_name = toy.cli(*verb, "toy")
    assert by_name[0] == 0, by_name
    monkeypatch.chdir(toy.root)
    assert toy.cli(*verb, "recipes/toy.yaml") == by_name
    assert toy.cli(*verb, str(toy.root / "recipes" / "toy.yaml")) == by_name
    monkeypatch.chdir(toy.root / "recipes")  # relative to the current directory, as make's
    assert toy.cli(*verb, "toy.yaml") == by_name
    assert toy.cli(*verb, "./toy.yaml") == by_name
    assert toy.cli(*verb, "*.yaml") == by_name  # a glob of files: toy.yaml is the only recipe


def test_a_file_that_is_no_recipe_is_a_usage_error(toy, monkeypatch):
    monkeypatch.chdir(toy.root)
    assert toy.cli("build", "--dry-run", "recipes/toi.yaml") == (
        2, "", "error: no recipe matches 'recipes/toi.yaml': No such file or directory (recipes: toy)\n")
    assert toy.cli("build", "--dry-run", "models/toy/saved_model.pb") == (
        2, "", f"error: 'models/toy/saved_model.pb' is not a recipe of the workspace {toy.root} "
               "(its recipes: recipes/*.yaml in tpubuild.yaml)\n")
    toy.write("recipes/toy.lock.yaml", "schema: '1'\n")
    assert toy.cli("list", "recipes/toy.lock.yaml") == (
        2, "", "error: 'recipes/toy.lock.yaml' is a lock file, not a recipe (its recipe is recipes/toy.yaml)\n")


def test_an_invalid_recipe_not_asked_for_is_one_warning_line(toy, monkeypatch):
    toy.write("recipes/bad.yaml", BAD)
    code, out, err = toy.cli("build", "--dry-run", "toy")
    assert (code, dry_run_plan(out), err) == (0, TOY_DRY_RUN, BAD_WARNING)
    code, out, err = toy.cli("render", "toy")
    assert (code, out, err) == (0, 'tpu_functions {\n  function_alias: "f"\n}\n', BAD_WARNING)
    assert toy.cli("validate", "toy") == (0, f"1 recipe OK in {toy.root}\n", BAD_WARNING)
    monkeypatch.chdir(toy.root)
    assert toy.cli("explain", "recipes/toy.yaml")[::2] == (0, BAD_WARNING)


def test_an_invalid_recipe_asked_for_is_reported_and_the_others_proceed(toy):
    toy.write("recipes/bad.yaml", BAD)
    # All asked for: the build stops before anything runs (bazel's loading phase)...
    assert toy.cli("build", "--dry-run") == (2, "", f"{BAD_FIRST}\n{BAD_SECOND}\n")
    # ...unless -k: toy is still planned, bad's every problem is printed, exit 2.
    code, out, err = toy.cli("build", "--dry-run", "-k")
    assert (code, dry_run_plan(out)) == (2, TOY_DRY_RUN)
    assert err.splitlines() == [BAD_FIRST, BAD_SECOND, "error: skipped, invalid: bad"]
    code, out, err = toy.cli("list")
    assert (code, out.split()[0], err.splitlines()) == (2, "toy", [BAD_FIRST, BAD_SECOND, "error: skipped, invalid: bad"])
    # Only the invalid one asked for: nothing to proceed with.
    assert toy.cli("build", "--dry-run", "bad") == (2, "", f"{BAD_FIRST}\n{BAD_SECOND}\n")
    assert toy.cli("render", "bad") == (2, "", f"{BAD_FIRST}\n{BAD_SECOND}\n")
    # validate of everything stays all-or-nothing.
    assert toy.cli("validate") == (2, "", f"{BAD_FIRST}\n{BAD_SECOND}\n")


def test_an_unparsable_recipe_is_found_by_its_file_name(toy):
    toy.write("recipes/broken.yaml", "model: [\n")
    code, out, err = toy.cli("list", "broken")
    assert (code, out) == (2, "")
    assert err.startswith("recipes/broken.yaml:2:1: YAML syntax error: ")
    assert toy.cli("list", "toy")[0] == 0


def test_a_duplicate_name_points_at_the_second_files_name_line(toy, monkeypatch):
    toy.write("recipes/zz.yaml", "# a copy\nname: toy\n" + GOOD)
    duplicate = "recipes/zz.yaml:2:1: name: recipe name 'toy' is also used by recipes/toy.yaml"
    assert toy.cli("validate") == (2, "", duplicate + "\n")
    assert toy.cli("render", "toy") == (2, "", duplicate + "\n")  # which one? neither, until renamed
    monkeypatch.chdir(toy.root)
    code, out, err = toy.cli("render", "recipes/toy.yaml")  # the file says which
    assert (code, err) == (0, "")


def test_building_zero_recipes_says_why(ws):
    ws.write("tpubuild.yaml", "recipes: [recipe/*.yaml]\n")  # a typo: the directory is recipes/
    ws.write("recipes/toy.yaml", GOOD)
    why = "warning: tpubuild.yaml: recipes glob 'recipe/*.yaml' matches no recipe file\n"
    assert ws.cli("validate") == (0, f"0 recipes OK in {ws.root}\n", why)
    assert ws.cli("build", "--dry-run") == (0, "0 recipes: nothing to do\n", why)  # the dry run's summary line
    assert ws.cli("list") == (0, "", why)


def test_a_recipes_glob_never_takes_the_workspace_file_for_a_recipe(ws):
    """`recipes: ["*.yaml"]` at the root matches tpubuild.yaml (or the file -w names) too:
    it is the workspace file, not an invalid recipe."""
    ws.write("tpubuild.yaml", 'recipes: ["*.yaml"]\n')
    ws.write("toy.yaml", GOOD.replace("../models/toy", "models/toy"))
    assert ws.cli("validate") == (0, f"1 recipe OK in {ws.root}\n", "")
    (ws.root / "tpubuild.yaml").rename(ws.root / "ci.yaml")
    code, out, err = ws.cli("-w", str(ws.root / "ci.yaml"), "list")
    assert (code, err) == (0, "") and out.startswith("toy"), out
    (ws.root / "ci.yaml").rename(ws.root / "tpubuild.yaml")
    ws.write("tpubuild.yaml", 'recipes: ["tpubuild.yaml"]\n')  # nothing else: no recipe at all
    assert ws.cli("validate")[2] == "warning: tpubuild.yaml: recipes glob 'tpubuild.yaml' matches no recipe file\n"


def test_validate_json(toy, monkeypatch):
    code, out, err = toy.cli("validate", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"workspace": str(toy.root), "recipes": [{"name": "toy", "file": "recipes/toy.yaml"}],
                               "problems": [], "warnings": [], "exit_code": 0}
    toy.write("recipes/bad.yaml", BAD)
    code, out, err = toy.cli("validate", "--json")
    assert (code, err) == (2, "")
    document = json.loads(out)
    assert document["exit_code"] == 2 and document["recipes"] == [{"name": "toy", "file": "recipes/toy.yaml"}]
    assert document["problems"][0] == {"file": "recipes/bad.yaml", "line": 3, "col": 36,
                                       "path": "converter.batch_options[0].max_batch_size",
                                       "message": "must be >= 1, got -1"}
    assert len(document["problems"]) == 2
    monkeypatch.chdir(toy.root)
    code, out, _ = toy.cli("validate", "--json", "recipes/toy.yaml")
    assert (code, json.loads(out)["warnings"]) == (0, [BAD_WARNING[len("warning: "):-1]])
    # A problem of the workspace file is in the document too.
    toy.write("tpubuild.yaml", "recipes: 3\n")
    code, out, err = toy.cli("validate", "--json")
    assert (code, err) == (2, "")
    assert json.loads(out) == {"workspace": str(toy.root), "recipes": [], "warnings": [], "exit_code": 2, "problems": [
        {"file": "tpubuild.yaml", "line": 1, "col": 10, "path": "recipes", "message": "expected a list, got 3"}]}


@pytest.mark.parametrize("argv, message", [
    (["inspect"], "Missing argument 'PATH'"),
    (["inspect", "nowhere"], "error: nowhere: no such directory (give a SavedModel directory)"),
    (["inspect", "tpubuild.yaml"], "error: tpubuild.yaml: is a file, not a directory (give a SavedModel directory)"),
    (["inspect", "recipes"], "error: recipes: not a SavedModel directory (no saved_model.pb)"),
    (["convert", "tpubuild.yaml", "out", "--recipe", "recipes/toy.yaml"], "Directory 'tpubuild.yaml' is a file"),
    (["render"], "Missing argument 'RECIPE'"),
    (["build", "--no-such-option"], "No such option"),
    (["schema", "recipes"], "'recipes' is not one of 'recipe', 'workspace'"),
    (["-w", "recipes/toy.yaml", "validate"], "error: recipes/toy.yaml is a recipe, not a workspace file: --workspace "
     "takes the workspace's directory or its tpubuild.yaml (to build one recipe: tpubuild build recipes/toy.yaml)\n"),
])
def test_every_usage_error_exits_2(toy, monkeypatch, argv, message):
    monkeypatch.chdir(toy.root)
    code, out, err = toy.cli(*argv)
    assert (code, out) == (2, ""), err
    assert message in err and "Traceback" not in err
