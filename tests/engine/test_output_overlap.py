"""output_dir and cache_dir may neither hold nor be held by a recipe's inputs (issue 13.2):
tpubuild deletes and rewrites what is in them."""

from __future__ import annotations

from tests.engine.conftest import export_recipe, source_recipe
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import check_output_overlap, load_workspace


def _problems(ws, settings: str) -> list[str]:
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(settings)
    workspace = load_workspace(override=ws)
    return check_output_overlap(workspace, load_recipes(workspace, None))


def test_default_directories_overlap_nothing(make_workspace):
    ws = make_workspace({"toy": source_recipe("toy"), "cut": export_recipe("cut")})
    assert _problems(ws, "") == []


def test_a_cache_inside_the_export_scripts_directory_is_an_error(make_workspace):
    ws = make_workspace({"cut": export_recipe("cut")})
    assert _problems(ws, "cache_dir: recipes/models/.cache\noutput_dir: recipes/models/tiny/out\n") == [
        "recipes/cut.yaml: output_dir recipes/models/tiny/out is inside model.export.script recipes/models, "
        "so tpubuild would write into the recipe's input; move one of them",
        "recipes/cut.yaml: cache_dir recipes/models/.cache is inside model.export.script recipes/models, "
        "so tpubuild would write into the recipe's input; move one of them",
    ]


def test_a_model_inside_the_output_dir_is_an_error(make_workspace):
    ws = make_workspace({"toy": source_recipe("toy")})
    assert _problems(ws, "output_dir: recipes/models\n") == [
        "recipes/toy.yaml: model.saved_model recipes/models/tiny is inside output_dir recipes/models, "
        "whose content tpubuild deletes and rewrites; move one of them",
    ]
