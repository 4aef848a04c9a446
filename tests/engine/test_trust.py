"""Issue 32: a shared cache no co-user can poison, objects that are regular files, version
numbers never reused, the layout validated, version names, provenance for standard tools."""

from __future__ import annotations

import json

from tests.engine.conftest import build_json, source_recipe, tpubuild


def test_only_ascii_digit_directories_are_versions(built_workspace):
    # `²` and `١` pass str.isdigit(); int() refuses the first and reads the second as 1.
    # Both are the user's directories: left alone, never a version, never a crash.
    ws = built_workspace
    for name in ("²", "١", "01"):
        (ws / "out" / "toy" / name).mkdir()
    (ws / "out" / "toy" / "١" / "keep.txt").write_text("mine")
    result = tpubuild(ws, "build", "--check")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = build_json(ws, "toy")
    assert [r["status"] for r in document["rows"] if r["stage"] == "publish"] == ["cached"]
    (ws / "recipes" / "toy.yaml").write_text((ws / "recipes" / "toy.yaml").read_text().replace("samples: 4", "samples: 3"))
    build_json(ws, "toy")
    assert {p.name for p in (ws / "out" / "toy").iterdir() if not p.name.startswith(".")} == \
        {"01", "1", "2", "١", "²"}
    assert (ws / "out" / "toy" / "١" / "keep.txt").read_text() == "mine"
    result = tpubuild(ws, "clean", "toy")
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (ws / "out" / "toy").iterdir()} == {"01", "١", "²"}


def test_output_dir_cache_dir_and_recipe_tree_must_not_contain_one_another(make_workspace):
    # Issue 32's reproduction: output_dir inside the cache, a recipe named `tmp`: the next
    # build's temp-session cleanup deleted published version 1.
    ws = make_workspace({"tmp": source_recipe("tmp")})
    cases = {
        "output_dir: .tpubuild/cache/v1\n":
            "tpubuild.yaml:2:13: output_dir: output_dir '.tpubuild/cache/v1' is inside cache_dir '.tpubuild/cache'",
        "cache_dir: out/cache\n": "tpubuild.yaml:2:12: cache_dir: cache_dir 'out/cache' is inside output_dir 'out'",
        "output_dir: recipes/out\n":
            "tpubuild.yaml:2:13: output_dir: output_dir 'recipes/out' is inside the recipe tree of 'recipes/*.yaml'",
        "output_dir: build\ncache_dir: build\n":
            "tpubuild.yaml:2:13: output_dir: output_dir 'build' is the same directory as cache_dir 'build'",
    }
    for text, expected in cases.items():
        (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n' + text)
        for command in (["validate"], ["build", "--dry-run"], ["list"]):
            result = tpubuild(ws, *command)
            assert result.returncode == 2, (command, result.stderr)
            assert result.stderr.splitlines()[0].startswith(expected), result.stderr
            assert "Traceback" not in result.stderr
    assert not (ws / "out").exists() and not (ws / "build").exists()
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\noutput_dir: build/out\ncache_dir: build/cache\n')
    assert tpubuild(ws, "validate").returncode == 0
