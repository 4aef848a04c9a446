"""`build --check` from lock files alone (engine/lockcheck.py) and what makes it as fast as a
no-op build: lock files read without a YAML parser, code digests without parsing whole files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli import REPO
from tpubuild.keys import code
from tpubuild.lock import MEASURED, lock_document, lock_text, read_lock, read_lock_keys


def _modules() -> list[tuple[Path, str]]:
    found = []
    for path in sorted(code.PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(code.PACKAGE_ROOT).with_suffix("").parts
        found.append((path, ".".join(("tpubuild", *(parts[:-1] if parts[-1] == "__init__" else parts)))))
    return found


def test_import_statements_found_by_pattern_are_those_of_the_syntax_tree():
    # The fast scan must never miss an import (a stage's key would miss code it runs), and
    # finds no more than the syntax tree (no stage reruns for a module named in prose).
    modules = _modules()
    assert len(modules) > 100
    for path, name in modules:
        assert code._imports(path, name) == code._parsed_imports(path.read_bytes(), path, name), name


def test_the_scan_falls_back_to_the_syntax_tree_where_a_pattern_would_miss(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('x = 1; import tpubuild.a\nif x: import tpubuild.b\nfrom tpubuild.c import (d,  # e)\n f)\n'
                      'RUN = ["python", "-m", "tpubuild.g"]\n')
    assert code._imports(source, "tpubuild.m") == {"tpubuild.a", "tpubuild.b", "tpubuild.c",
                                                   "tpubuild.c.d", "tpubuild.c.f", "tpubuild.g"}


@pytest.mark.parametrize("lock", sorted((REPO / "recipes").glob("*.lock.yaml")), ids=lambda p: p.name)
def test_the_line_reader_reads_what_the_yaml_parser_reads(lock):
    fast, full = read_lock_keys(lock), read_lock(lock)
    assert fast is not None
    full.pop("artifact")
    assert fast.pop("artifact") == {}
    # The line reader also sees the marker comment of a measured key, which YAML drops.
    measured = [s["stage"] for s in fast["stages"] if s["key_measured"]]
    marked = [line for line in lock.read_text().splitlines() if line.startswith("  key: ") and line.endswith(MEASURED)]
    assert len(measured) == len(marked)
    for stage in fast["stages"]:
        stage["key_measured"] = False
    assert fast == full


def test_a_lock_file_of_another_layout_is_read_by_the_yaml_parser(tmp_path):
    document = lock_document("r", "d" * 64, {"python": "CPython 3.11"}, {"file:a b.py": "a" * 64},
                             [{"stage": "export", "key": "b" * 64, "output": "c" * 64,
                               "discovered": {"m/x.py": "absent", "dist:keras": "3.1"}}])
    path = tmp_path / "r.lock.yaml"
    path.write_text(lock_text(document))
    written = read_lock_keys(path)
    assert written["stages"][0]["discovered"] == {"dist:keras": "3.1", "m/x.py": "absent"}
    assert written["inputs"] == {"file:a b.py": "a" * 64}
    # Hand-edited into flow style (still YAML): the same document through the YAML parser.
    path.write_text(lock_text(document).replace("toolchain:\n  python: \"CPython 3.11\"",
                                                 "toolchain: {python: CPython 3.11}"))
    edited = read_lock_keys(path)
    assert edited["toolchain"] == {"python": "CPython 3.11"}
    assert edited["stages"] == written["stages"]


def test_a_fresh_clone_is_checked_from_recorded_hashes_alone(built_workspace, monkeypatch):
    """CI's fresh clone: no cache, no stat cache, no memo. quick_check proves every lock
    file current from the hashes it records (no recipe loaded, no key computed); anything
    that could change a key sends --check down the full path, which names it."""
    from tests.cli import CLI, tpubuild
    from tests.engine.conftest import build_json
    from tpubuild.lock import quick_check

    ws = built_workspace
    # An import of a module not loaded yet looks in the script's folder first: absent there.
    script = ws / "recipes" / "models" / "copy_export.py"
    script.write_text(script.read_text().replace("import shutil\n", "import shutil\nimport colorsys\n"))
    build_json(ws, "cut")
    shutil.rmtree(ws / ".tpubuild")
    shutil.rmtree(ws / "out")
    assert quick_check(ws, None) == 3
    assert (ws / ".tpubuild" / "statcache.json").is_file()  # the next check hashes by stat
    assert quick_check(ws, None) == 3
    check = tpubuild(ws, "build", "--check")
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n"), check.stderr
    # The executable answers before it imports the CLI (tpubuild/entry.py): no click, no PyYAML.
    check = tpubuild(ws.parent, "-w", str(ws), "build", "--check", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n"), check.stderr
    imported = {line.split("|")[-1].strip() for line in check.stderr.splitlines() if line.startswith("import time:")}
    assert "tpubuild.lock.quickcheck" in imported and not {"click", "yaml", "tensorflow"} & imported
    # Its answer to a full disk is the CLI's: one line, exit 1 (/dev/full fails every write).
    with open("/dev/full", "w") as full:
        done = subprocess.run([*CLI, "build", "--check"], cwd=ws, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (1, "error: No space left on device\n")

    # A key line edited by hand (or stitched together by a merge): the planning digest
    # covers the recorded keys, so the full check computes the key and names the stage.
    lock_path = ws / "recipes" / "toy.lock.yaml"
    original = lock_path.read_text()
    stage = original.split("- stage: ")[2].split("\n")[0]  # the second stage
    at = original.index(f"- stage: {stage}\n  key: ") + len(f"- stage: {stage}\n  key: ")
    lock_path.write_text(original[:at] + "0" * 63 + "a" + original[at + 64:])
    assert quick_check(ws, None) is None
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1 and check.stdout.startswith(
        f"recipes/toy.yaml: building would change recipes/toy.lock.yaml: stage {stage}"), check.stdout + check.stderr
    lock_path.write_text(original)
    assert quick_check(ws, None) == 3

    # The workspace file decides defaults and layout: the full path decides, and a change
    # that changes no key changes no lock file.
    workspace = (ws / "tpubuild.yaml").read_text()
    (ws / "tpubuild.yaml").write_text(workspace + "# a comment\n")
    assert quick_check(ws, None) is None
    assert tpubuild(ws, "build", "--check").returncode == 0
    (ws / "tpubuild.yaml").write_text(workspace)

    # A key variable set: every key changes.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert quick_check(ws, None) is None
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    assert quick_check(ws, None) == 3

    # A module created where the export's import looked and found nothing.
    lock = (ws / "recipes" / "cut.lock.yaml").read_text()
    absent = next(line.split('"')[1] for line in lock.splitlines() if line.endswith("colorsys.py\": absent"))
    (ws / absent).parent.mkdir(parents=True, exist_ok=True)
    (ws / absent).write_text("")
    assert quick_check(ws, None) is None
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1
    assert f"stage export would run (module {absent}: created where an import looked" in check.stdout
    (ws / absent).unlink()

    # A recipe's own text, even a comment: the full path decides (a comment changes no key).
    recipe = ws / "recipes" / "toy.yaml"
    text = recipe.read_text()
    recipe.write_text(text + "# reviewed\n")
    assert quick_check(ws, None) is None
    assert tpubuild(ws, "build", "--check").returncode == 0
    recipe.write_text(text.replace("samples: 4", "samples: 5"))
    check = tpubuild(ws, "build", "--check")
    assert (check.returncode, check.stdout) == (
        1, "recipes/toy.yaml: building would change recipes/toy.lock.yaml: stage warmup would run (the recipe changed)\n")
    recipe.write_text(text)
    assert quick_check(ws, None) == 3


def test_extends_chain_reads_the_bases_as_the_recipe_loader_does(tmp_path):
    """The quick path's guess of a recipe's files (no YAML parser) equals what the loader
    reads (Recipe.files) for the ways `extends:` is written: a wrong guess would only send
    --check down its full path, but a right one is what makes it fast."""
    from tpubuild.config.finding import extends_chain
    from tpubuild.config.recipe import load_recipes
    from tpubuild.config.workspace import load_workspace

    (tmp_path / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    common = tmp_path / "recipes" / "common"
    common.mkdir(parents=True)
    (common / "root.yaml").write_text("verify: {samples: 3}\n")
    (tmp_path / "recipes" / "m").mkdir()  # a model directory (its content is not read here)
    (tmp_path / "recipes" / "m" / "saved_model.pb").write_bytes(b"")
    (common / "mid.yaml").write_text("extends: 'root.yaml'  # quoted\nconverter: {}\n")
    (tmp_path / "recipes" / "r.yaml").write_text(
        "# yaml-language-server: $schema=x\nname: r\nextends: \"common/mid.yaml\"\nmodel: {saved_model: m}\n")
    (tmp_path / "recipes" / "s.yaml").write_text("name: s\nextends: common/root.yaml\nmodel: {saved_model: m}\n")
    recipes = load_recipes(load_workspace(tmp_path), None)
    assert [len(r.files) for r in recipes] == [3, 2]
    for recipe in recipes:
        assert [path for path, _ in extends_chain(recipe.file)] == [Path(p).resolve() for p in recipe.files]
