"""The xla_aot and xla_aot_verify stages on a real SavedModel, with tfcompile and g++."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xla_aot_models import BATCH_SIZES, STEPS, UNITS, build, save, verify

from tpubuild.errors import StageError


def test_artifact_has_header_objects_and_cmake_for_each_signature_and_batch(artifact) -> None:
    out, result = artifact
    facts = json.loads((out / "xla_aot.json").read_text())
    libraries = {(lib["signature"], lib["batch"]): lib for lib in facts["libraries"]}
    assert sorted(libraries) == [("serving_default", b) for b in BATCH_SIZES]
    cmake = (out / "xla_aot.cmake").read_text()
    for batch in BATCH_SIZES:
        lib = libraries["serving_default", batch]
        assert lib["cpp_class"] == f"tpubuild_xla_aot::serving_default_b{batch}"
        assert lib["files"] == [f"serving_default_b{batch}.h", f"serving_default_b{batch}.o",
                                f"serving_default_b{batch}_constants.o"]
        for name in lib["files"]:
            assert (out / name).stat().st_size > 0
        assert f"class serving_default_b{batch} final" in (out / lib["header"]).read_text()
        # Inputs fixed at the batch size; names sorted, so argument order is stable.
        assert [(a["input"], a["dtype"], a["shape"]) for a in lib["args"]] == [
            ("ids", "int32", [batch, STEPS]), ("state", "float32", [batch, UNITS])]
        assert [(r["output"], r["shape"]) for r in lib["results"]] == [
            ("logits", [batch, 2]), ("state", [batch, UNITS])]
        assert f"add_library(tpubuild_xla_aot_serving_default_b{batch} STATIC" in cmake
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f for lib in libraries.values() for f in lib["files"]] + ["xla_aot.cmake", "xla_aot.json"])
    assert [lib["bytes"] > 0 for lib in result.summary["libraries"]] == [True, True]


def test_harness_matches_the_source_within_tolerance_and_times_both(verified) -> None:
    out, result = verified
    summary = result.summary
    assert summary["passed"] is True
    # Exact kind: XLA's fusions change float32 summation order only (see xla_aot_verify).
    assert summary["tolerance"] == {"kind": "exact", "rtol": 1e-5, "atol": 1e-6,
                                    "given": {"rtol": None, "atol": None}}
    assert summary["samples"] == {"serving_default": {"count": 7, "from": "random"}}
    # Every output of every batch size was compared on all 7 samples (padding rows dropped).
    assert sorted((o["signature"], o["output"], o["elements"]) for o in summary["outputs"]) == sorted(
        (f"serving_default@batch{b}", name, 7 * size) for b in BATCH_SIZES
        for name, size in (("logits", 2), ("state", UNITS)))
    by_batch = {lib["batch"]: lib for lib in summary["libraries"]}
    assert by_batch[1]["padding_rows"] == 0 and by_batch[3]["padding_rows"] == 2
    for lib in by_batch.values():
        assert lib["latency_ns"]["xla_aot"] > 0 and lib["latency_ns"]["tensorflow"] > 0
        assert all(size > 0 for size in lib["files"].values())
    assert json.loads((out / "xla_aot_verify.json").read_text())["passed"] is True
    # What `tpubuild report` reads (targets contract): seconds per call by signature@batch.
    calls = summary["latency"]["call_seconds"]
    assert sorted(calls["xla_aot"]) == sorted(calls["source"]) == [f"serving_default@{b}" for b in BATCH_SIZES]
    assert calls["xla_aot"]["serving_default@1"] == by_batch[1]["latency_ns"]["xla_aot"] / 1e9
    assert summary["size"] > sum(by_batch[1]["files"].values())


def test_unsupported_op_fails_with_one_line_naming_signature_and_op(source, workspace, tmp_path, capfd) -> None:
    with pytest.raises(StageError) as failure:
        build(source, tmp_path / "out", workspace, signatures=["strings"])
    message = str(failure.value)
    assert message == ("xla_aot: signature 'strings' batch 1: op AsString is not supported by "
                       "XLA's CPU compiler (tfcompile)")
    # The compiler's own output (TensorFlow's log lines) goes to the stage's log only.
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_a_dimension_other_than_the_batch_left_unknown_fails_naming_the_input(source, workspace, tmp_path) -> None:
    with pytest.raises(StageError) as failure:
        build(source, tmp_path / "out", workspace, signatures=["any_length"], batch_sizes=[2])
    assert str(failure.value) == ("xla_aot: signature 'any_length' input 'ids': shape (2, -1) has unknown "
                                  "dimension 1; only dimension 0 is fixed by batch_sizes")


def test_batch_sizes_must_be_positive(source, workspace, tmp_path) -> None:
    with pytest.raises(StageError, match=r"^targets\.xla_aot\.batch_sizes must be a non-empty list of integers >= 1"):
        build(source, tmp_path / "out", workspace, batch_sizes=[0])


@pytest.fixture(scope="module")
def other_library(tmp_path_factory, workspace) -> tuple[Path, Path]:
    """(source, library) of the `unrolled` signature of a model with other weights."""
    root = tmp_path_factory.mktemp("other")
    other = save(root / "model", seed=4)
    build(other, root / "lib", workspace, signatures=["unrolled"], batch_sizes=[3])
    return other, root / "lib"


def test_same_bytes_on_a_second_build(other_library, workspace, tmp_path) -> None:
    # The loop unrolled, as in the example model: with a While loop, XLA orders the
    # arguments of the loop's kernel differently from run to run (see targets/xla_aot/compile.py).
    other, first = other_library
    second = tmp_path / "second-with-a-longer-name"
    build(other, second, workspace, signatures=["unrolled"], batch_sizes=[3])
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    differing = [n for n in names if (first / n).read_bytes() != (second / n).read_bytes()]
    assert differing == []


def test_library_of_another_model_fails_verification_with_one_line(source, other_library, workspace,
                                                                    tmp_path) -> None:
    # Same signature and shapes, other weights: the harness runs, the outputs differ.
    with pytest.raises(StageError) as failure:
        verify(source, other_library[1], tmp_path / "verify", workspace, signatures=["unrolled"], batch_sizes=[3])
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("xla_aot_verify: signature 'unrolled@batch3' output ")
    assert "differs from the source: max abs error" in message and "(atol 1e-06 + rtol 1e-05" in message
