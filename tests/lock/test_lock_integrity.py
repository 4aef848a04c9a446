"""Issue 39: a lock file no build wrote as it is (a stale output, a second stage list, a stage
listed twice or unknown, a field lock_text does not write)
fails `build --check` with one line naming the file and line, and the next build rewrites it."""

from __future__ import annotations

import re

from tests.cli import tpubuild
from tpubuild.lock import read_lock_keys


def _tampered(text: str) -> dict[str, tuple[str, str]]:
    """Each way of damaging `cut`'s lock file `text`: (damaged text, the line --check prints after
    `recipes/cut.yaml: building would change recipes/cut.lock.yaml: `)."""
    lines = text.split("\n")
    stages = lines.index("stages:")
    version = next(i for i, line in enumerate(lines) if line.startswith("artifact:"))  # the artifact's facts
    export = re.search(r"- stage: export\n  key: \S+\n  output: (\S+)", text)
    assert export is not None
    first = lines.index("- stage: export") + 1
    report = lines.index("- stage: report") + 1
    return {
        # An output that the export's key did not make (the cache's record of that key says which it did).
        "stale output": (text.replace(export.group(0), export.group(0)[: -64] + "0" * 63 + "a"),
                         f"stage export: it records output 000000000000 for its key, which made "
                         f"{export.group(1)[:12]} (a stale lock file)"),
        # A merge that kept both sides' lists: PyYAML alone reads the second one.
        "second stage list": ("\n".join(lines[:version] + lines[stages:version] + lines[version:]),
                              f"malformed: recipes/cut.lock.yaml:{version + 1}:1: stages: duplicate key "
                              f"(first set on line {stages + 1})"),
        "stage listed twice": ("\n".join(lines[:version] + lines[stages + 1:version] + lines[version:]),
                               f"malformed: recipes/cut.lock.yaml:{version + 1}:3: stage export is listed twice"),
        "unknown stage": (text.replace("- stage: report", "- stage: reprot"),
                          f"malformed: recipes/cut.lock.yaml:{report}:3: 'reprot' is not a stage tpubuild has"),
        "unknown field": ("\n".join(lines[:version] + ["flavour: 3"] + lines[version:]),
                          f"malformed: recipes/cut.lock.yaml:{version + 1}:1: unknown field 'flavour'"),
        "a stage's unknown field": (text.replace(export.group(0), export.group(0) + "\n  flavour: 3"),
                                    f"malformed: recipes/cut.lock.yaml:{first + 3}:3: stage export: unknown "
                                    "field 'flavour'"),
    }


def test_a_lock_file_no_build_wrote_fails_the_check_and_is_rewritten(built_workspace):
    ws = built_workspace
    lock = ws / "recipes" / "cut.lock.yaml"
    assert tpubuild(ws, "build", "--check").returncode == 0
    built = lock.read_text()
    for case, (damaged, why) in _tampered(built).items():
        lock.write_text(damaged)
        check = tpubuild(ws, "build", "--check")
        expected = f"recipes/cut.yaml: building would change recipes/cut.lock.yaml: {why}"
        assert (check.returncode, check.stdout.splitlines() + check.stderr.splitlines()) == (1, [expected]), case
        build = tpubuild(ws, "build", "cut")
        assert build.returncode == 0, (case, build.stderr)
        assert f"recipes/cut.yaml: rewrote recipes/cut.lock.yaml: {why}" in build.stderr.splitlines(), case
        assert lock.read_text() == built, case  # what the build writes, byte for byte
        check = tpubuild(ws, "build", "--check")
        assert check.returncode == 0, (case, check.stdout, check.stderr)


def test_the_lock_file_reader_refuses_a_key_given_twice(tmp_path):
    # PyYAML keeps the last of two equal keys; the line reader and the YAML fallback refuse both.
    lock = tmp_path / "x.lock.yaml"
    text = ("schema: 2\nrecipe: x\nrecipe_digest: " + "a" * 64 + "\ntoolchain: {}\ninputs:\n  \"file:a\": "
            + "b" * 64 + "\n  \"file:a\": " + "c" * 64 + "\nstages: []\nartifact:\n")
    lock.write_text(text)
    assert read_lock_keys(lock) is None
    lock.write_text(text.replace('  "file:a": ' + "c" * 64 + "\n", ""))
    assert read_lock_keys(lock)["inputs"] == {"file:a": "b" * 64}


def test_a_stage_the_edited_recipe_no_longer_runs_is_stale_not_malformed(built_workspace):
    """Dropping batch_options from a recipe leaves its lock file listing the batch stage:
    that file records the build before the edit. `--check` says the build would change it,
    not that it is malformed, and the build rewrites it without a word about it."""
    from tests.engine.conftest import BATCH

    ws = built_workspace
    recipe = ws / "recipes" / "toy.yaml"
    batch = BATCH.format(timeout=100)
    assert batch in recipe.read_text() and "- stage: batch" in (ws / "recipes" / "toy.lock.yaml").read_text()
    recipe.write_text(recipe.read_text().replace(batch, ""))
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    [line] = check.stdout.splitlines()
    assert line.startswith("recipes/toy.yaml: building would change recipes/toy.lock.yaml: ") and "malformed" not in line
    build = tpubuild(ws, "build", "toy")
    assert build.returncode == 0, build.stderr
    assert "rewrote" not in build.stderr and "malformed" not in build.stderr, build.stderr
    assert "- stage: batch" not in (ws / "recipes" / "toy.lock.yaml").read_text()
    assert tpubuild(ws, "build", "--check").returncode == 0
