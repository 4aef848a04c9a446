"""`explain` and `build --check` tell the truth: each cause of a rerun once and none
invented, the stages a build then runs (early cutoff included), and an empty cache said
as such rather than taken for a change."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cli import tpubuild
from tests.engine.conftest import build_json, export_recipe, statuses
from tests.engine.test_outputs import _modules_after

CHANGED = r"content changed \([0-9a-f]{12} -> [0-9a-f]{12}\)"


def _explain(ws: Path, recipe: str) -> dict[str, list[str]]:
    """stage -> [what explain says of it, then each reason], keys left out."""
    result = tpubuild(ws, "explain", recipe)
    assert result.returncode == 0, result.stderr
    stages: dict[str, list[str]] = {}
    for line in result.stdout.splitlines()[1:]:
        if line.startswith("    - "):
            stages[stage].append(line[len("    - "):])
        else:
            stage, _, what = line.strip().partition(": ")
            stages[stage] = [re.sub(r" \(key [0-9a-f]{16}\)$", "", what)]
    return stages


def _export_record(ws: Path, recipe: str) -> dict:
    """The stored record of the export stage the lock file names."""
    lock = yaml.safe_load((ws / "recipes" / f"{recipe}.lock.yaml").read_text())
    key = next(s["key"] for s in lock["stages"] if s["stage"] == "export")
    return json.loads((ws / ".tpubuild" / "cache" / "v1" / "stages" / key[:2] / f"{key}.json").read_text())["record"]


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_a_comment_edit_of_an_export_script_reruns_the_export_alone(built_workspace):
    ws = built_workspace
    script = ws / "recipes" / "models" / "copy_export.py"
    # A module found after the script's own directory: the import looked there first, and
    # the record keeps that path as absent (a file created there would be imported).
    script.write_text("import colorsys  # noqa: F401\n" + script.read_text())
    first = build_json(ws, "cut")
    assert statuses(first, "cut") == {"export": "built", "verify": "cached", "report": "cached", "publish": "cached"}
    assert _export_record(ws, "cut")["discovered"]["recipes/models/colorsys.py"] == "absent"

    script.write_text(script.read_text() + "# a comment: the SavedModel it writes is the same\n")
    explained = _explain(ws, "cut")
    # The script is a declared and an imported input: one cause, and no path where an
    # import found nothing is reported "removed".
    assert list(explained) == ["export", "verify", "report", "publish"]
    assert explained["export"][0] == "would run" and len(explained["export"]) == 2, explained
    assert re.fullmatch(f"input file:recipes/models/copy_export.py: {CHANGED}", explained["export"][1])
    for stage in ("verify", "report", "publish"):
        assert explained[stage] == ["cached if export's output is unchanged"]
    assert _modules_after(ws, ["explain", "cut"]) == (0, False)  # planning never imports TensorFlow
    # What the build then does: the export, and nothing after it.
    second = build_json(ws, "cut")
    assert statuses(second, "cut") == {"export": "built", "verify": "cached", "report": "cached", "publish": "cached"}
    assert second["versions"] == {"cut": 1}
    assert set(e[0] for e in _explain(ws, "cut").values()) == {"cached"}

    # A module created where the import looked last time is a cause, named as such.
    (ws / "recipes" / "models" / "colorsys.py").write_text("")
    assert _explain(ws, "cut")["export"] == [
        "would run", "module recipes/models/colorsys.py: created where an import looked last time and found nothing"]


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_a_later_stage_that_runs_anyway_says_why(built_workspace):
    ws = built_workspace
    recipe = ws / "recipes" / "cut.yaml"
    recipe.write_text(recipe.read_text().replace("samples: 4", "samples: 5"))
    (ws / "recipes" / "models" / "notes.py").write_text('# notes, edited\nNOTE = "first"\n')
    explained = _explain(ws, "cut")
    assert explained["export"][0] == "would run"
    assert re.fullmatch(f"input file:recipes/models/notes.py: {CHANGED}", explained["export"][1])
    assert explained["verify"] == ["would run", "option samples: 4 -> 5"]
    assert explained["report"] == ["cached if the outputs of export and verify are unchanged"]
    doc = build_json(ws, "cut")
    assert statuses(doc, "cut")["export"] == "built" and statuses(doc, "cut")["verify"] == "built"


def test_a_fresh_clone_says_the_cache_is_empty(built_workspace):
    """explain reads the cache; build --check answers from the lock files alone (CI's
    fresh clone: engine/lockcheck.py)."""
    ws = built_workspace
    shutil.rmtree(ws / ".tpubuild")
    shutil.rmtree(ws / "out")
    empty = "nothing has been built on this machine yet (the cache is empty)"
    assert _explain(ws, "cut")["export"] == ["would run", empty]
    assert _explain(ws, "toy")["source"] == ["would run", empty]
    check = tpubuild(ws, "build", "--check")
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n")
    # An input whose hash differs from the lock file's is a change, cache or not.
    (ws / "recipes" / "models" / "notes.py").write_text('NOTE = "second"\n')
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1
    assert re.fullmatch(r"recipes/cut.yaml: building would change recipes/cut.lock.yaml: stage export would run "
                        rf"\(input file:recipes/models/notes.py: {CHANGED}\)\n", check.stdout)
    # A cache that lacks some records (toy shares its source with other) changes nothing.
    build_json(ws, "toy")
    check = tpubuild(ws, "build", "--check", "other")
    assert (check.returncode, check.stdout) == (0, "1 lock file up to date\n")


@pytest.mark.slow
def test_a_tensorflow_export_script_edited_in_a_comment(make_workspace):
    """The README's claim, with a real TensorFlow export: its SavedModel is byte-identical,
    so the export reruns and nothing after it; `import tensorflow` looked in the script's
    directory first, and that path is no cause."""
    ws = make_workspace({"exp": export_recipe("exp")})
    build_json(ws)
    assert _export_record(ws, "exp")["discovered"]["recipes/models/tensorflow.py"] == "absent"
    script = ws / "recipes" / "models" / "tiny_export.py"
    script.write_text(script.read_text().replace("class Tiny", "# a comment\nclass Tiny"))
    explained = _explain(ws, "exp")
    assert explained["export"][0] == "would run" and len(explained["export"]) == 2, explained
    assert re.fullmatch(f"input file:recipes/models/tiny_export.py: {CHANGED}", explained["export"][1])
    assert {stage: e for stage, e in explained.items() if stage != "export"} == {
        stage: ["cached if export's output is unchanged"] for stage in ("verify", "report", "publish")}
    doc = build_json(ws)
    assert statuses(doc, "exp") == {"export": "built", "verify": "cached", "report": "cached", "publish": "cached"}


def test_a_list_items_field_is_named_by_its_path_as_diff_names_it(built_workspace):
    """issue 42: `batch_options[0].batch_timeout_micros: 100 -> 200`, not both whole lists."""
    from tests.engine.conftest import source_recipe

    ws = built_workspace
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", timeout=200))
    assert _explain(ws, "toy")["batch"] == ["would run", "option batch_options[0].batch_timeout_micros: 100 -> 200"]
    dry = tpubuild(ws, "build", "--dry-run", "toy")
    assert "toy: batch: would run (option batch_options[0].batch_timeout_micros: 100 -> 200)" in dry.stdout.splitlines()
