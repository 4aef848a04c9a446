"""`tpubuild inspect` on every example model of the repository's workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf
from click.testing import CliRunner

from tests.example_workspace import example_exports as distinct_exports
from tpubuild.cli import cli
from tpubuild.tpu.inspect import inspect

EXPORTS = distinct_exports()


@pytest.fixture(scope="session")
def example_models(example_exports: dict[str, Path]) -> dict[str, Path]:
    """Each distinct export of the example workspace, exported once for the suite (tests/conftest.py)."""
    return example_exports


@pytest.mark.parametrize("key", sorted(EXPORTS))
def test_inspect_lists_what_the_model_has(example_models: dict[str, Path], key: str) -> None:
    path = example_models[key]
    info = inspect(path)
    loaded = tf.saved_model.load(str(path))
    assert info["tag_sets"] == [["serve"]] and info["tags"] == ["serve"]
    assert sorted(info["signatures"]) == sorted(loaded.signatures)
    for name, sig in info["signatures"].items():
        args, kwargs = loaded.signatures[name].structured_input_signature
        want = {
            spec.name or key: {"dtype": spec.dtype.name, "shape": "[" + ", ".join(
                "None" if d is None else str(d) for d in spec.shape.as_list()) + "]"}
            for key, spec in kwargs.items()
        }
        assert sig["inputs"] == want
        outputs = loaded.signatures[name].structured_outputs
        assert sorted(sig["outputs"]) == sorted(outputs)
        assert sig["function"] in {f["name"] for f in info["functions"]}
    # Every alias names a listed function, and that function carries it.
    by_name = {f["name"]: f for f in info["functions"]}
    for alias, fn in info["aliases"].items():
        assert by_name[fn]["alias"] == alias
    assert info["tpu_and_batch_ops"] == {}  # exported models are not converted yet
    text = CliRunner().invoke(cli, ["inspect", str(path)])
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[:2] == [f"SavedModel {path}", "tag sets: serve"]
    assert json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output) == json.loads(json.dumps(info))


def test_inspect_two_tpu_functions_shows_aliases_callers_and_xla(example_models: dict[str, Path]) -> None:
    info = inspect(example_models["two_tpu_functions:export"])
    by_alias = {f["alias"]: f for f in info["functions"] if f["alias"]}
    assert sorted(by_alias) == ["tpu_func_1", "tpu_func_2"]
    # Both towers are called directly by the same function (serve), which the signature calls.
    [caller] = by_alias["tpu_func_1"]["callers"]
    assert by_alias["tpu_func_2"]["callers"] == [caller]
    signature_fn = info["signatures"]["serving_default"]["function"]
    assert {f["name"]: f["callers"] for f in info["functions"]}[caller] == [signature_fn]
    assert all(f["xla"] == {"compilable": True} for f in by_alias.values())


def test_inspect_names_the_op_that_xla_cannot_compile(example_models: dict[str, Path]) -> None:
    info = inspect(example_models["string_preprocess:export"])
    signature_fn = info["signatures"]["serving_default"]["function"]
    by_name = {f["name"]: f for f in info["functions"]}
    reason = by_name[signature_fn]["xla"]
    assert reason["compilable"] is False
    assert "has no XLA kernel and cannot run on the TPU" in reason["reason"]
    assert [f["xla"] for f in info["functions"] if f["alias"] == "tpu_func"] == [{"compilable": True}]


def test_inspect_shows_tpu_and_batch_ops_of_a_converted_model(two_tpu_placed: Path) -> None:
    info = inspect(two_tpu_placed)
    # One TPUReplicatedOutput per output of each TPU body (tpu.py's output chain).
    assert info["tpu_and_batch_ops"] == {
        "TPUOrdinalSelector": 2, "TPUPartitionedCall": 2, "TPUReplicateMetadata": 2, "TPUReplicatedOutput": 2
    }
    text = CliRunner().invoke(cli, ["inspect", str(two_tpu_placed)]).output
    assert text.splitlines()[-2] == (
        "TPU / batch ops: TPUOrdinalSelector x2, TPUPartitionedCall x2, TPUReplicateMetadata x2, TPUReplicatedOutput x2"
    )


def test_inspect_of_a_directory_without_a_model_is_one_line(tmp_path: Path, capsys) -> None:
    from tpubuild.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(tmp_path)])
    assert exit_info.value.code == 2  # a usage error: the wrong path was given (issue 30 item 7)
    assert capsys.readouterr().err == f"error: {tmp_path}: not a SavedModel directory (no saved_model.pb)\n"


def test_inspect_says_the_host_side_of_a_placement_runs_on_the_host(two_tpu: Path, tmp_path: Path) -> None:
    """The functions that hold the TPUPartitionedCall and the BatchFunction tpubuild wrote
    run on the host by design: inspect says so, never that they cannot run on the TPU."""
    options = tmp_path / "converter.yaml"
    options.write_text("converter:\n  tpu_functions: [{function_alias: tpu_func_1}, {function_alias: tpu_func_2}]\n"
                       "  batch_options: [{max_batch_size: 8, allowed_batch_sizes: [2, 4, 8]}]\n")
    out = tmp_path / "converted"
    done = CliRunner().invoke(cli, ["convert", str(two_tpu), str(out), "--options-file", str(options)])
    assert done.exit_code == 0, done.output
    info = inspect(out)
    assert info["tpu_and_batch_ops"]["TPUPartitionedCall"] == 2 and info["tpu_and_batch_ops"]["BatchFunction"] == 2
    by_name = {f["name"]: f for f in info["functions"]}
    bodies = sorted(f["name"] for f in info["functions"] if f["tpu"])
    assert [by_name[b]["alias"] for b in bodies] == ["tpu_func_1", "tpu_func_2"]
    assert all(by_name[b]["xla"] == {"compilable": True} and by_name[b]["host"] is None for b in bodies)
    # The signature's function reaches both TPU functions and the batching, all from the host.
    signature_fn = by_name[info["signatures"]["serving_default"]["function"]]
    assert signature_fn["host"] == {"tpu_functions": bodies, "batching": True} and signature_fn["xla"] is None
    text = CliRunner().invoke(cli, ["inspect", str(out)]).output
    assert "cannot run on the TPU" not in text and "not XLA-compilable" not in text
    lines = text.splitlines()
    wrapper = lines.index(f"  {signature_fn['name']} (signature serving_default)")
    assert lines[wrapper + 1] == (f"    called by: the graph / no function; runs on the host, by design: calls "
                                  f"{', '.join(bodies)} on the TPU through TPUPartitionedCall; "
                                  "batches requests with BatchFunction")
