"""Lock files, --check, explain, --dry-run, clean, gc, and TensorFlow-free planning."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from tests.engine.conftest import REPO, build_json, source_recipe, statuses, tpubuild
from tpubuild.report.formats import human_bytes


def test_lock_file_contents_and_determinism(built_once, built_workspace):
    ws0, first = built_once
    text = (ws0 / "recipes" / "toy.lock.yaml").read_text()
    lock = yaml.safe_load(text)
    assert text.startswith("# Written by `tpubuild build`; commit it, do not edit it.\nschema: 2\nrecipe: toy\n")
    # No published version's number: what the local out/ holds is not the lock file's (a revert
    # restores the committed file byte for byte).
    assert list(lock) == ["schema", "recipe", "recipe_digest", "toolchain", "planning", "inputs", "stages",
                          "artifact"]
    # What build --check compares before trusting the keys without computing them.
    assert re.search(r"^planning: [0-9a-f]{64}  # tpubuild's code, the workspace file, the key", text, re.M)
    # What a reviewer reads in a pull request's diff, from the published report.
    artifact = lock["artifact"]
    assert list(artifact) == ["converter_options", "size", "size_bytes", "parameters", "cost", "max_abs_error",
                              "warnings", "peak_memory", "peak_memory_bytes"]
    # Each stage a worker ran says its worker's peak memory (measured); the build's is the largest.
    peaks = {s["stage"]: s["peak_memory"] for s in lock["stages"] if "peak_memory" in s}
    assert set(peaks) == {"batch", "verify", "warmup", "report"} and min(peaks.values()) > 100 * 2**20, peaks
    assert artifact["peak_memory_bytes"] == max(peaks.values())
    report = json.loads((ws0 / "out" / "toy" / "1" / "tpubuild-report.json").read_text())
    assert artifact["size_bytes"] == report["size"]["artifact"]["total"]
    assert artifact["parameters"] == {"float32": 2}
    assert artifact["cost"] == {"tpu_share": "0.00%", "total": report["cost"]["total"]}
    assert "  max_abs_error: 0.0  # measured on the building machine\n" in text
    assert set(lock["toolchain"]) == {"python", "tensorflow", "numpy", "protobuf", "ml_dtypes"}
    # Verification errors are floats measured on this CPU: marked, and so is what embeds them.
    measured = [s["stage"] for s in lock["stages"] if s.get("measured")]
    assert measured == ["verify", "report", "publish"]
    # verify's key hashes nothing measured; the report's and publish's keys hash verify's output.
    stages_text = "".join(line for line in text.split("\nartifact:")[0].splitlines(keepends=True)
                          if not line.startswith("  peak_memory: "))  # measured too, every worker stage's
    assert stages_text.count("# measured on the building machine") == 2 * len(measured) - 1
    assert list(lock["inputs"]) == ["dir:recipes/models/tiny"]
    assert [(s["stage"], s["key"]) for s in lock["stages"]] == [
        (row["stage"], row["key"]) for row in first["rows"] if row["recipe"] == "toy"
    ]
    assert all(len(s["key"]) == 64 and len(s["output"]) == 64 for s in lock["stages"])
    manifest = json.loads((ws0 / "out" / "toy" / "1" / "tpubuild-manifest.json").read_text())
    assert manifest["content"] == lock["stages"][-1]["output"]
    assert manifest["recipe_digest"] == lock["recipe_digest"]
    assert [s["key"] for s in manifest["stages"]] == [s["key"] for s in lock["stages"][:-1]]
    cut = yaml.safe_load((ws0 / "recipes" / "cut.lock.yaml").read_text())
    # Declared files, and the modules the export imported (discovered).
    assert list(cut["inputs"]) == ["file:recipes/models/copy_export.py", "file:recipes/models/notes.py",
                                   "import:recipes/models/copy_export.py", "import:recipes/models/notes.py"]
    # What the export's code imported, with its hash, as its key hashes it (build --check).
    assert cut["stages"][0]["discovered"]["recipes/models/notes.py"] == cut["inputs"]["import:recipes/models/notes.py"]
    # Rebuilding changes no lock file, byte for byte.
    build_json(built_workspace)
    assert (built_workspace / "recipes" / "toy.lock.yaml").read_text() == text


def test_check_lists_the_recipes_whose_lock_would_change(built_workspace):
    ws = built_workspace
    ok = tpubuild(ws, "build", "--check")
    assert (ok.returncode, ok.stdout) == (0, "3 lock files up to date\n")
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=9))
    (ws / "recipes" / "models" / "notes.py").write_text('NOTE = "second"\n')
    stale = tpubuild(ws, "build", "--check")
    assert stale.returncode == 1
    cut, toy = stale.stdout.splitlines()
    assert cut.startswith("recipes/cut.yaml: building would change recipes/cut.lock.yaml: stage export would run "
                          "(input file:recipes/models/notes.py: content changed (")
    assert toy == ("recipes/toy.yaml: building would change recipes/toy.lock.yaml: stage warmup would run "
                   "(option samples: 4 -> 9)")
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1"]  # nothing was built


def test_check_in_a_fresh_clone_answers_from_the_lock_files(built_workspace, tmp_path):
    # CI's clone: recipes, models and lock files; no cache, no stat cache, no no-op memo.
    clone = tmp_path / "clone"
    shutil.copytree(built_workspace, clone, ignore=shutil.ignore_patterns(".tpubuild", "out"))
    assert _modules_after(clone, ["build", "--check"]) == (0, False)  # up to date, TensorFlow not imported
    assert not (clone / ".tpubuild" / "cache").exists()  # no stage record was looked for
    ok = tpubuild(clone, "build", "--check")
    assert (ok.returncode, ok.stdout) == (0, "3 lock files up to date\n")
    (clone / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=9))
    (clone / "recipes" / "models" / "notes.py").write_text('NOTE = "second"\n')
    (clone / "recipes" / "models" / "tiny" / "extra.txt").write_text("a file of the model\n")
    stale = tpubuild(clone, "build", "--check")
    assert stale.returncode == 1, stale.stderr
    assert len(stale.stdout.splitlines()) == 3, (stale.stdout, stale.stderr)
    cut, other, toy = stale.stdout.splitlines()

    def says(line: str, name: str, stage: str) -> bool:
        return line.startswith(f"recipes/{name}.yaml: building would change recipes/{name}.lock.yaml: "
                               f"stage {stage} would run (")

    assert says(cut, "cut", "export") and "input file:recipes/models/notes.py: content changed (" in cut
    assert says(other, "other", "source") and says(toy, "toy", "source")  # the first changed key is named
    (clone / "recipes" / "models" / "tiny" / "extra.txt").unlink()
    check = tpubuild(clone, "build", "--check", "toy")
    assert check.returncode == 1 and says(check.stdout, "toy", "warmup"), check.stdout


def test_explain_and_dry_run_name_what_changed(built_workspace):
    ws = built_workspace
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=5))
    result = tpubuild(ws, "explain", "toy")
    assert result.returncode == 0, result.stderr
    lines = [re.sub(r"\(key [0-9a-f]{16}\)", "(key K)", line) for line in result.stdout.splitlines()]
    assert lines == [
        "recipes/toy.yaml: recipe toy",
        "  source: cached (key K)",
        "  batch: cached (key K)",
        "  warmup: would run (key K)",
        "    - option samples: 4 -> 5",
        "  verify: would run (key K)",
        "    - option samples: 4 -> 5",
        # Decided once verify has run: early cutoff (engine/explain.py).
        "  report: cached if verify's output is unchanged",
        "  publish: cached if the outputs of warmup and verify are unchanged",
    ]
    dry = json.loads(tpubuild(ws, "build", "--dry-run", "--json", "toy").stdout)
    assert [(r["stage"], r["status"], r["state"]) for r in dry["rows"]] == [
        ("source", "cached", "cached"), ("batch", "cached", "cached"), ("warmup", "pending", "would run"),
        ("verify", "pending", "would run"), ("report", "pending", "cached if verify's output is unchanged"),
        ("publish", "pending", "cached if the outputs of warmup and verify are unchanged"),
    ]
    assert dry["summary"] == {"cached": 2, "would run": 2, "cached if unchanged": 2}
    # Text: a row per stage that is not cached yet, with explain's words and reasons, then a summary.
    text = tpubuild(ws, "build", "--dry-run", "toy")
    assert (text.returncode, text.stdout.splitlines()) == (0, [
        "toy: warmup: would run (option samples: 4 -> 5)",
        "toy: verify: would run (option samples: 4 -> 5)",
        "toy: report: cached if verify's output is unchanged",
        "toy: publish: cached if the outputs of warmup and verify are unchanged",
        "1 recipe: 2 would run, 2 cached if unchanged, 2 cached",
    ])
    # -v: every stage, and each says what explain says of it, in the same words.
    verbose = tpubuild(ws, "build", "--dry-run", "-v", "toy").stdout.splitlines()
    explained = []
    for line in lines[1:]:
        if line.startswith("    - "):
            explained[-1][2].append(line[6:])
        else:
            stage, _, state = line.strip().partition(": ")
            explained.append([stage, state.removesuffix(" (key K)"), []])
    assert verbose[:-1] == [f"toy: {stage}: {state}" + (f" ({'; '.join(why)})" if why else "")
                            for stage, state, why in explained]
    assert verbose[-1] == "1 recipe: 2 would run, 2 cached if unchanged, 2 cached"
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1"]


def test_clean_then_build_republishes_from_the_cache(built_workspace):
    ws = built_workspace
    result = tpubuild(ws, "clean", "toy")
    assert (result.returncode, result.stdout) == (0, "removed out/toy\n")
    assert not (ws / "out" / "toy").exists()
    doc = build_json(ws, "toy")
    assert statuses(doc, "toy") == {
        "source": "cached", "batch": "cached", "verify": "cached", "warmup": "cached", "report": "cached",
        "publish": "built",
    }
    assert doc["versions"] == {"toy": 1}


def test_gc_keeps_what_lock_files_reference(built_workspace):
    ws = built_workspace
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=5))
    build_json(ws, "toy")
    result = tpubuild(ws, "gc", "--keep-days", "0")
    assert result.returncode == 0, result.stderr
    # Sizes as people read them (`4.6 MiB kept`); what is kept is every object left in the cache.
    objects = ws / ".tpubuild" / "cache" / "v1" / "objects"
    kept = sum(f.stat().st_size for f in objects.rglob("*") if f.is_file())
    assert re.fullmatch(rf"removed 3 stage entries and \d+ objects \(\d+(\.\d)? (B|KiB|MiB)\); "
                        rf"{re.escape(human_bytes(kept))} kept\n", result.stdout), result.stdout
    assert "bytes" not in result.stdout
    doc = build_json(ws)
    assert {row["status"] for row in doc["rows"]} == {"cached"}


def _modules_after(ws, args: list[str]) -> tuple[int, bool]:
    code = (
        "import sys\nfrom tpubuild.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print('EXIT', code, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    last = out.stdout.strip().splitlines()[-1].split()
    return int(last[1]), last[2] == "True"


def test_planning_never_imports_tensorflow(built_workspace):
    ws = built_workspace
    assert _modules_after(ws, ["build"]) == (0, False)  # a no-op build
    assert _modules_after(ws, ["build", "--dry-run"]) == (0, False)
    assert _modules_after(ws, ["build", "--check"]) == (0, False)
    assert _modules_after(ws, ["explain", "toy"]) == (0, False)


def test_config_error_exits_2_before_anything_runs(make_workspace):
    ws = make_workspace({
        "good": source_recipe("good"),
        "bad": "name: bad\nmodel: {saved_model: models/tiny}\nconverter: {bogus: 1}\n",
    })
    result = tpubuild(ws, "build")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "recipes/bad.yaml:3:13: converter.bogus: unknown key 'bogus' (allowed: batch_options, bfloat16_optimization, "
        "bfloat16_optimization_options, disable_default_optimizations, enable_device_placement_safety_checks, "
        "experimental_options, io_shape_optimization, quantization_options, tpu_functions, xla_sharding_options)",
    ]
    assert not (ws / ".tpubuild").exists() and not (ws / "out").exists()
