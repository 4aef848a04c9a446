"""The example of issue 12, `recipes/all_targets.yaml`, built with the real CLI: all four
targets built and verified, a second build all cached, and a LiteRT-only option change
rebuilds the LiteRT chain (and the publish step) only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.example_workspace import copy_built_examples

TARGET_DIRS = ("cpu_savedmodel", "litert", "xla_aot")


def build(root: Path, *args: str) -> dict:
    result = tpubuild(root, "build", "--json", *args, "all_targets")
    assert result.returncode == 0, result.stderr
    # No warning: the example's flatbuffer is stateless (its LSTM is not fused).
    assert not [line for line in result.stderr.splitlines() if "warning:" in line], result.stderr
    return json.loads(result.stdout)


def statuses(document: dict) -> dict[str, str]:
    return {row["stage"]: row["status"] for row in document["rows"]}


@pytest.fixture(scope="module")
def example(built_examples_run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A copy of the built example workspace (tests/conftest.py: every recipe built in one
    run, all_targets among them), and the rows of all_targets in that first build."""
    # The first build's warnings: none (the example's flatbuffer is stateless, its LSTM not fused).
    assert not built_examples_run.warnings(), built_examples_run.stderr
    root = tmp_path_factory.mktemp("all_targets") / "ws"
    copy_built_examples(built_examples_run.root, root)
    return root, {"rows": [row for row in built_examples_run.document["rows"] if row["recipe"] == "all_targets"]}


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_every_target_is_built_verified_and_published(example) -> None:
    root, first = example
    assert set(statuses(first).values()) == {"built"}
    manifest = json.loads((root / "out/all_targets/1/tpubuild-manifest.json").read_text())
    assert sorted(manifest["targets"]) == sorted(TARGET_DIRS)
    for target in TARGET_DIRS:
        assert manifest["targets"][target]["verify"]["passed"] is True, target
        published = {p.relative_to(root / "out/all_targets" / target / "1").as_posix()
                     for p in (root / "out/all_targets" / target / "1").rglob("*") if p.is_file()}
        assert set(manifest["targets"][target]["files"]) <= published, target
    litert = manifest["targets"]["litert"]["verify"]
    # The lookup fused, the LSTM op by op: a stateless flatbuffer, like the source.
    assert litert["fused"] == ["embedding_matmul"]
    assert "EMBEDDING_LOOKUP" in litert["ops"] and "UNIDIRECTIONAL_SEQUENCE_LSTM" not in litert["ops"]
    from tpubuild.targets.litert.flatbuffer import variable_tensors

    assert variable_tensors((root / "out/all_targets/litert/1/model.tflite").read_bytes()) == 0
    assert (root / "out/all_targets/xla_aot/1/xla_aot.cmake").is_file()


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_the_cpu_savedmodel_computes_in_bfloat16_like_the_tpu_artifact(example) -> None:
    """docs/targets/cpu_savedmodel.md: the CPU twin of a recipe whose bfloat16 stage ran
    serves what the TPU artifact computes, in bfloat16, verified at the bfloat16 tolerances."""
    from tests.tolerances import computes_in

    root, first = example
    assert statuses(first)["bfloat16"] == "built"  # bfloat16_optimization: the default, ENABLED
    assert computes_in(root / "out/all_targets/1") == "bfloat16"
    assert computes_in(root / "out/all_targets/cpu_savedmodel/1") == "bfloat16"
    manifest = json.loads((root / "out/all_targets/1/tpubuild-manifest.json").read_text())
    assert manifest["targets"]["cpu_savedmodel"]["verify"]["tolerance"] == {
        "kind": "bfloat16", "rtol": 2e-2, "atol": 1e-3, "given": {"rtol": None, "atol": None}}
    # The targets converted from the float32 source compute in float32.
    assert manifest["targets"]["xla_aot"]["verify"]["tolerance"]["kind"] == "exact"
    assert manifest["targets"]["litert"]["verify"]["tolerance"]["kind"] == "exact"


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_second_build_is_cached_and_a_litert_option_rebuilds_only_its_chain(example) -> None:
    root, _ = example
    assert set(statuses(build(root)).values()) == {"cached"}
    recipe = root / "recipes/all_targets.yaml"
    text = recipe.read_text()
    assert "    composites: [embedding_matmul]\n" in text
    recipe.write_text(text.replace("    composites: [embedding_matmul]\n", "    composites: none\n"))
    rebuilt = statuses(build(root))
    assert {stage for stage, status in rebuilt.items() if status == "built"} == {"litert", "litert_verify", "publish"}
    tpu_1, tpu_2 = (root / "out/all_targets" / n / "saved_model.pb" for n in ("1", "2"))
    assert tpu_1.read_bytes() == tpu_2.read_bytes()
    manifest = json.loads((root / "out/all_targets/2/tpubuild-manifest.json").read_text())
    unfused = manifest["targets"]["litert"]["verify"]
    assert unfused["fused"] == [] and "UNIDIRECTIONAL_SEQUENCE_LSTM" not in unfused["ops"]
    report = tpubuild(root, "report", "all_targets")
    assert report.returncode == 0, report.stderr
    assert "litert: composites: embedding_matmul not fused (not kept)" in report.stdout
