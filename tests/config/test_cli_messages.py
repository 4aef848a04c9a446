"""Messages a new user meets before any build (issue 42 items 4 and 6): a mistyped verb, a
recipe file the workspace's globs do not reach, a YAML line indented wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import tpubuild

USAGE = "Usage: tpubuild [OPTIONS] COMMAND [ARGS]...\nTry 'tpubuild --help' for help.\n\n"


@pytest.mark.parametrize(("typed", "meant"), [("biuld", "build"), ("valdate", "validate"), ("explian", "explain"),
                                              ("verfy", "verify"), ("gcc", "gc"), ("int", "init")])
def test_a_mistyped_verb_gets_a_suggestion(tmp_path: Path, typed: str, meant: str) -> None:
    done = tpubuild(tmp_path, typed)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"{USAGE}Error: No such command '{typed}'. Did you mean '{meant}'?\n"


def test_an_unknown_verb_far_from_any_is_clicks_plain_error(tmp_path: Path) -> None:
    done = tpubuild(tmp_path, "xyzzy")
    assert (done.returncode, done.stderr) == (2, f"{USAGE}Error: No such command 'xyzzy'.\n")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    (tmp_path / "recipes" / "vision").mkdir(parents=True)
    (tmp_path / "models" / "toy").mkdir(parents=True)
    (tmp_path / "models" / "toy" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "recipes" / "toy.yaml").write_text("model: {saved_model: ../models/toy}\n")
    return tmp_path


def test_a_recipe_outside_the_globs_is_named_with_the_glob(ws: Path) -> None:
    (ws / "recipes" / "vision" / "toy2.yaml").write_text("model: {saved_model: ../../models/toy}\n")
    for verb in ("build", "validate", "explain"):
        done = tpubuild(ws, verb, "toy2")
        assert (done.returncode, done.stdout) == (2, ""), verb
        assert done.stderr == (
            "error: no recipe matches 'toy2': recipes/vision/toy2.yaml is not a recipe of this workspace: the recipes "
            "glob 'recipes/*.yaml' of tpubuild.yaml does not match it (add 'recipes/vision/*.yaml' to `recipes:` to "
            "build it)\n"), verb
    # Where no such file exists, the names there are (or the closest one), as before.
    done = tpubuild(ws, "build", "toy3")
    assert done.stderr == "error: no recipe matches 'toy3' (did you mean 'toy'?)\n"
    # The outputs, the cache and hidden directories are not searched.
    (ws / "recipes" / "vision" / "toy2.yaml").unlink()
    (ws / "out" / "toy2").mkdir(parents=True)
    (ws / "out" / "toy2" / "toy2.yaml").write_text("")
    (ws / ".git").mkdir()
    (ws / ".git" / "toy2.yaml").write_text("")
    assert tpubuild(ws, "build", "toy2").stderr == "error: no recipe matches 'toy2' (did you mean 'toy'?)\n"


@pytest.mark.parametrize(("text", "expected"), [
    # A list item indented one column less than its neighbours.
    ("model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions:\n    - function_alias: f\n"
     "   - function_alias: g\n",
     "recipes/toy.yaml:5:4: YAML syntax error: bad indentation: line 5 is indented less or more than its "
     "neighbours; the keys of one mapping (here the one from line 3, column 3) start in the same column"),
    # A key indented less than the key above it in the same mapping.
    ("model:\n    saved_model: ../models/toy\n  tags: [serve]\n",
     "recipes/toy.yaml:3:3: YAML syntax error: bad indentation: line 3 is indented less or more than its "
     "neighbours; the keys of one mapping (here the one from line 1, column 1) start in the same column"),
    # A key under a list item indented like the item's dash.
    ("model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions:\n    - function_alias: f\n    x: 1\n",
     "recipes/toy.yaml:5:5: YAML syntax error: bad indentation: line 5 is indented less or more than its "
     "neighbours; the items of one list (here the one from line 4, column 5) each start with `- ` in the same "
     "column"),
    # A key indented more than the key above it: YAML reads `key: value` inside a value.
    ("model:\n  saved_model: ../models/toy\n    tags: [serve]\n",
     "recipes/toy.yaml:3:9: YAML syntax error: bad indentation, or a `: ` inside a value: if line 3 holds a key, "
     "it is indented more than the key above it (the keys of one mapping start in the same column); if the `: ` "
     "is part of a value, quote the value"),
])
def test_bad_indentation_is_said_in_words(ws: Path, text: str, expected: str) -> None:
    (ws / "recipes" / "toy.yaml").write_text(text)
    done = tpubuild(ws, "validate")
    assert (done.returncode, done.stderr) == (2, expected + "\n")
