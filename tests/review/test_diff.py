"""`tpubuild diff` and `--changed-since` on a real built workspace in a real git repository."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli import tpubuild
from tests.review.conftest import RECIPES, affected, diff_json, git, write_samples
from tpubuild.review.compare import RecipeChange, StageChange
from tpubuild.review.formats import markdown

OWN_BATCH = """\
converter:
  batch_options:
    - num_batch_threads: 1
      max_batch_size: 4
      batch_timeout_micros: 200
      allowed_batch_sizes: [2, 4]
      max_enqueued_batches: 10
      experimental: {signature_name: serving_default}
"""


def test_one_recipes_batch_option_in_all_formats(repo):
    with open(repo / "recipes" / "plain.yaml", "a") as f:
        f.write(OWN_BATCH)
    document = diff_json(repo, "main")
    assert document["schema"] == 1 and document["head"] == "working tree"
    changed = affected(document)
    assert list(changed) == ["plain"]
    plain = changed["plain"]
    assert plain["status"] == "changed" and plain["rebuild_from"] == "batch"
    assert plain["fields"] == [{"path": "converter.batch_options[0].batch_timeout_micros", "old": 100, "new": 200}]
    assert "-  batch_timeout_micros: 100" in plain["render_diff"]
    assert "+  batch_timeout_micros: 200" in plain["render_diff"]
    stages = {s["stage"]: s for s in plain["stages"]}
    assert list(stages)[0] == "batch" and "verify" in stages and "publish" in stages
    assert stages["batch"]["causes"] == ["option batch_options[0].batch_timeout_micros: 100 -> 200"]
    assert stages["batch"]["cached"] is False  # nobody built this timeout
    assert "its input batch is rebuilt" in stages["verify"]["causes"]

    text = tpubuild(repo, "diff", "main", code=0).stdout
    assert "1 recipe affected: 1 rebuild from batch" in text
    assert "changed plain (recipes/plain.yaml)" in text
    assert "- option batch_options[0].batch_timeout_micros: 100 -> 200" in text

    md = tpubuild(repo, "diff", "main", "--format", "markdown", "--exit-code", code=1).stdout
    assert md.splitlines()[0] == "**tpubuild diff**: 1 recipe affected: 1 rebuild from batch"
    assert "| `plain` | changed | batch | - | - |" in md
    assert "<details><summary>changed plain (recipes/plain.yaml)</summary>" in md

    # Committed on a branch: the default BASE is the merge base with main, and two
    # revisions compare the same way as the working tree.
    git(repo, "checkout", "-q", "-b", "feature")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "timeout")
    assert list(affected(diff_json(repo))) == ["plain"]
    between = diff_json(repo, "main", "HEAD")
    assert list(affected(between)) == ["plain"] and between["head"].startswith("HEAD (")
    assert affected(between)["plain"]["stages"][0]["cached"] is None  # HEAD is not the working tree


def test_a_stage_already_in_the_cache(repo):
    # Without its dataset, `sampled` verifies like `plain`, whose verify result is cached.
    (repo / "recipes" / "sampled.yaml").write_text(
        "name: sampled\nextends: common/base.yaml\nmodel: {saved_model: models/tiny}\n")
    stages = affected(diff_json(repo, "main"))["sampled"]["stages"]
    # warmup, then verify (pipeline.py MAIN_STAGES): both read verify's samples, both cached.
    assert [s["stage"] for s in stages[:2]] == ["warmup", "verify"], stages
    for stage in stages[:2]:
        assert stage["cached"] is True
        assert any(c.startswith("option representative_datasets") for c in stage["causes"]), stage


def assert_text_and_markdown_agree(repo, changed: dict) -> None:
    """The text and markdown formats name the same recipes, stages and first causes as json."""
    text = tpubuild(repo, "diff", "main", code=0).stdout
    md = tpubuild(repo, "diff", "main", "--format", "markdown", code=0).stdout
    assert md.splitlines()[0].startswith(f"**tpubuild diff**: {len(changed)} recipe")  # the summary line
    for name, recipe in changed.items():
        for out in (text, md):
            assert name in out
            for stage in recipe["stages"]:
                assert stage["stage"] in out and stage["causes"][0] in out


def test_shared_base_edit_affects_every_recipe_using_it(repo):
    base = repo / "recipes" / "common" / "base.yaml"
    base.write_text(base.read_text().replace("batch_timeout_micros: 100", "batch_timeout_micros: 300"))
    changed = affected(diff_json(repo, "main"))
    assert sorted(changed) == sorted(RECIPES)
    assert {r["rebuild_from"] for r in changed.values()} == {"batch"}
    assert_text_and_markdown_agree(repo, changed)
    listed = json.loads(tpubuild(repo, "list", "--changed-since", "main", "--json", code=0).stdout)
    assert sorted(row["name"] for row in listed) == sorted(RECIPES)


def test_dataset_edit_affects_the_recipe_reading_it(repo):
    write_samples(repo / "recipes" / "models" / "samples.tfrecord", 2.0)
    changed = affected(diff_json(repo, "main"))
    assert list(changed) == ["sampled"]
    stages = changed["sampled"]["stages"]
    # warmup, then verify (pipeline.py MAIN_STAGES): both read the samples.
    assert [s["stage"] for s in stages[:2]] == ["warmup", "verify"], stages
    for stage in stages[:2]:
        assert stage["causes"][0].startswith("input file:recipes/models/samples.tfrecord: content changed"), stage
    assert_text_and_markdown_agree(repo, changed)
    listed = json.loads(tpubuild(repo, "list", "--changed-since", "main", "--json", code=0).stdout)
    assert [row["name"] for row in listed] == ["sampled"]
    dry = json.loads(tpubuild(repo, "build", "--changed-since", "main", "--dry-run", "--json", code=0).stdout)
    assert {row["recipe"] for row in dry["rows"]} == {"sampled"}


def test_imported_helper_edit_affects_the_export(repo):
    (repo / "recipes" / "models" / "helper.py").write_text("SCALE = 3.0\n")
    changed = affected(diff_json(repo, "main"))
    assert list(changed) == ["exported"]
    export = changed["exported"]["stages"][0]
    assert export["stage"] == "export"
    # The helper is imported by the export and declared in its `deps`: named once, as the input.
    assert [c for c in export["causes"] if "helper.py" in c] == ["input file:recipes/models/helper.py: content changed"]
    assert_text_and_markdown_agree(repo, changed)


def test_comment_only_edit_affects_nothing(repo):
    for rel in ("recipes/common/base.yaml", "recipes/plain.yaml"):
        with open(repo / rel, "a") as f:
            f.write("# a comment, and nothing else\n")
    assert git(repo, "status", "--short").count(" M ") == 2
    done = tpubuild(repo, "diff", "--exit-code", code=0)
    assert done.stdout.splitlines()[1] == "no recipe affected"
    assert "no recipe affected" in tpubuild(repo, "diff", "--format", "markdown", code=0).stdout
    assert tpubuild(repo, "build", "--changed-since", "main", code=0).stdout == "no recipe affected since main\n"
    bad = tpubuild(repo, "diff", "no-such-branch", code=2)
    assert bad.stderr == "error: unknown git revision 'no-such-branch'\n"


def test_added_removed_renamed(repo):
    recipes = repo / "recipes"
    git(repo, "mv", "recipes/plain.yaml", "recipes/renamed.yaml")
    (recipes / "renamed.yaml").write_text((recipes / "renamed.yaml").read_text().replace("name: plain", "name: renamed"))
    git(repo, "rm", "-q", "recipes/exported.yaml", "recipes/exported.lock.yaml")
    (recipes / "fresh.yaml").write_text(RECIPES["plain"].replace("name: plain", "name: fresh") + "verify: {samples: 8}\n")
    document = diff_json(repo, "main")
    status = {r["name"]: r["status"] for r in document["recipes"]}
    assert status == {"renamed": "renamed", "fresh": "added", "sampled": "unchanged", "exported": "removed"}
    by_name = {r["name"]: r for r in document["recipes"]}
    assert by_name["renamed"]["old_name"] == "plain"
    assert [s["stage"] for s in by_name["renamed"]["stages"]] == ["publish"]  # the rest is cached under plain's keys
    text = tpubuild(repo, "diff", "main", "--exit-code", code=1).stdout
    assert "renamed plain -> renamed (recipes/renamed.yaml)" in text
    assert "removed exported (recipes/exported.yaml)" in text
    assert "added fresh (recipes/fresh.yaml)" in text
    listed = json.loads(tpubuild(repo, "list", "--changed-since", "main", "--json", code=0).stdout)
    assert sorted(row["name"] for row in listed) == ["fresh", "renamed"]


def test_diff_never_imports_tensorflow(repo):
    with open(repo / "recipes" / "plain.yaml", "a") as f:
        f.write(OWN_BATCH)
    probe = ("import sys\nfrom tpubuild.cli import main\ntry:\n    main(['diff', 'main'])\nexcept SystemExit:\n"
             "    pass\nprint('tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=repo, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "False" and "changed plain" in done.stdout


def test_markdown_stays_under_the_comment_limit():
    changes = [RecipeChange(f"r{i:03d}", "changed", f"recipes/r{i:03d}.yaml",
                            fields=[("verify.samples", 4, 8)],
                            stages=[StageChange("verify", ["option samples: 4 -> 8" + " x" * 200])])
               for i in range(100)]
    text = markdown(changes, "main", "working tree", limit=6000)
    assert len(text) <= 6000
    assert "details were left out to stay under GitHub's 6,000-character comment limit" in text
    assert text.count("<details>") >= 1 and "| `r099` | changed | verify |" in text


def test_artifact_deltas_where_head_is_built(repo):
    """Lock files gaining an `artifact:` mapping (the figures of issue 10): the diff shows
    HEAD's against BASE's once HEAD's lock file records a build of HEAD's recipe."""
    from tpubuild.config.recipe import load_recipes
    from tpubuild.config.workspace import load_workspace

    lock = repo / "recipes" / "plain.lock.yaml"
    text = lock.read_text()
    text = text[: text.index("\nartifact:") + 1] if "\nartifact:" in text else text  # the section, written anew
    lock.write_text(text + "artifact:\n  size_bytes: 1000\n  max_abs_error: 0.002\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "figures")
    with open(repo / "recipes" / "plain.yaml", "a") as f:
        f.write(OWN_BATCH)
    assert affected(diff_json(repo, "main"))["plain"]["artifact"] == {}  # HEAD not built yet
    digest = {r.name: r.digest for r in load_recipes(load_workspace(override=repo / "tpubuild.yaml"))}["plain"]
    text = lock.read_text().replace("size_bytes: 1000", "size_bytes: 520")
    old_digest = next(line for line in text.splitlines() if line.startswith("recipe_digest:"))
    lock.write_text(text.replace(old_digest, f"recipe_digest: {digest}"))
    document = diff_json(repo, "main")
    assert affected(document)["plain"]["artifact"] == {
        "size_bytes": {"old": 1000, "new": 520, "delta": -480, "percent": -48.0},
        "max_abs_error": {"old": 0.002, "new": 0.002, "delta": 0.0, "percent": 0.0},
    }
    assert document["summary"].startswith("1 recipe affected: 1 rebuild from batch; size -48%")
    assert "size_bytes: 1000 -> 520 (-48%)" in tpubuild(repo, "diff", "main", code=0).stdout


def _edit_model(repo):
    variables = repo / "recipes" / "models" / "tiny" / "variables" / "variables.data-00000-of-00001"
    data = bytearray(variables.read_bytes())
    data[-1] ^= 1
    variables.write_bytes(bytes(data))


def _edit_script(repo):
    script = repo / "recipes" / "models" / "tiny_export.py"
    script.write_text(script.read_text() + "\n# edited\n")


def _edit_defaults(repo):
    with open(repo / "tpubuild.yaml", "a") as f:
        f.write("defaults:\n  verify: {seed: 3}\n")


def _edit_unread(repo):
    (repo / "recipes" / "models" / "NOTES.txt").write_text("nobody reads this\n")


# Every kind of input of the test workspace: the edit, the recipes it must affect, and the
# beginning of the first cause of the first stage that reruns.
INPUT_KINDS = {
    "shared model directory": (_edit_model, {"plain": "input dir:recipes/models/tiny", "sampled": "input dir:"}),
    "export script": (_edit_script, {"exported": "input file:recipes/models/tiny_export.py"}),
    "workspace defaults": (_edit_defaults, {name: "option seed" for name in RECIPES}),
    "a file nobody reads": (_edit_unread, {}),
}


@pytest.mark.parametrize("kind", sorted(INPUT_KINDS))
def test_every_kind_of_input_yields_its_affected_recipes(repo, kind):
    edit, expected = INPUT_KINDS[kind]
    edit(repo)
    changed = affected(diff_json(repo, "main"))
    assert sorted(changed) == sorted(expected)
    for name, cause in expected.items():
        assert changed[name]["stages"][0]["causes"][0].startswith(cause), changed[name]["stages"][0]
        # The export script is a declared input and an imported module: it is named once.
        named = [c for c in changed[name]["stages"][0]["causes"] if "tiny_export.py" in c]
        assert len(named) <= 1, named
    listed = json.loads(tpubuild(repo, "list", "--changed-since", "main", "--json", code=0).stdout)
    assert sorted(row["name"] for row in listed) == sorted(expected)
