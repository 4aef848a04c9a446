"""The report stage: cost split, sizes, parameters, verification figures, HLO files."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.stage_helpers import Runner
from tpubuild.report import formats as report_format

TAGS = ["serve"]


def verify_and_report(runner: Runner, source: Path, artifact: Path, applied: list[str]) -> dict:
    runner.inputs["source"] = source
    runner.run("verify", artifact, {"tags": TAGS, "applied": applied, "representative_datasets": {},
                                    "samples": 4, "seed": 0, "rtol": None, "atol": None})
    out, result = runner.run("report", artifact, {"tags": TAGS})
    report = json.loads((out / "tpubuild-report.json").read_text())
    assert (out / "tpubuild-report.md").read_text() == report_format.to_markdown(report)
    assert result.summary["files"][:2] == ["tpubuild-report.json", "tpubuild-report.md"]
    return {"dir": out, "report": report, "result": result}


def test_two_tpu_functions_and_cpu_preprocessing_split(runner: Runner, two_tpu: Path, two_tpu_placed: Path) -> None:
    got = verify_and_report(runner, two_tpu, two_tpu_placed, ["tpu"])
    cost = got["report"]["cost"]
    # tpu_func_1: MatMul 2*32*64 + Relu 64; tpu_func_2: MatMul 2*64*8;
    # CPU: Cast, RealDiv, Sub over 32 inputs each + Softmax over 8 scores (per example).
    assert [(row["alias"], row["cost"]) for row in cost["tpu_functions"]] == [("tpu_func_1", 4160), ("tpu_func_2", 1024)]
    assert (cost["tpu"], cost["cpu"], cost["total"]) == (5184, 104, 5288)
    assert cost["tpu"] + cost["cpu"] == cost["total"]
    text = report_format.to_text(got["report"]).splitlines()
    assert text[:5] == [
        "Conversion report",
        "TPU cost of the model: 98.03% (5184/5288)",
        "CPU cost of the model: 1.97% (104/5288)",
        "  TPU function tpu_func_1: 4160 (78.67%)",
        "  TPU function tpu_func_2: 1024 (19.36%)",
    ]
    # Verification went through the CPU twin and is exact.
    assert got["report"]["verify"]["passed"] is True
    assert got["report"]["verify"]["max_abs_error"] <= 1e-6


def test_hlo_of_each_tpu_function_is_saved(runner: Runner, two_tpu: Path, two_tpu_placed: Path) -> None:
    got = verify_and_report(runner, two_tpu, two_tpu_placed, ["tpu"])
    hlo = got["report"]["hlo"]
    assert sorted(hlo) == ["tpu_func_1", "tpu_func_2"]
    first = (got["dir"] / hlo["tpu_func_1"]["file"]).read_text()
    assert first.startswith("HloModule ")
    assert "f32[1,32]" in first and "f32[32,64]" in first and "dot(" in first
    assert "f32[64,8]" in (got["dir"] / hlo["tpu_func_2"]["file"]).read_text()
    assert not [p.name for p in got["dir"].iterdir() if p.name.startswith(".")]


def _without_metadata(hlo: str) -> str:
    """HLO text without its metadata (the TF op names, which carry the callers' names)."""
    return re.sub(r", metadata=\{[^}]*\}", "", hlo)


def test_a_body_split_from_a_signature_has_its_hlo_and_cost(runner: Runner, dense_placed: dict[str, Path]) -> None:
    """Placed by signature, the TPU body is a copy of the signature's function that no
    object-graph node holds; its variables come from the signature's captures (tpu/captures.py).
    Its HLO is the computation that placing the same function by alias lowers."""
    source = dense_placed["alias"].parent.parent / "models" / "dense_aliased"
    got = verify_and_report(runner, source, dense_placed["signature"], ["tpu"])
    assert got["result"].warnings == []
    (label, entry), = got["report"]["hlo"].items()
    assert label.endswith("_tpu") and "error" not in entry, entry
    (row,) = got["report"]["cost"]["tpu_functions"]
    assert row["function"] == entry["function"] and row["cost"] == got["report"]["cost"]["tpu"] > 0
    by_signature = (got["dir"] / entry["file"]).read_text()
    assert "f32[64,128]" in by_signature and "f32[128,10]" in by_signature and "dot(" in by_signature

    runner.inputs.clear()
    runner.results.clear()
    alias = verify_and_report(runner, source, dense_placed["alias"], ["tpu"])
    assert alias["result"].warnings == []
    by_alias = (alias["dir"] / alias["report"]["hlo"]["serve"]["file"]).read_text()
    assert _without_metadata(by_signature) == _without_metadata(by_alias)


def test_a_body_whose_variables_cannot_be_told_says_why(dense_placed: dict[str, Path], tmp_path: Path) -> None:
    """A TPU body called with a resource its caller makes itself (no captured variable)
    is not exposed; the report's line names the argument and the node."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.captures import bound_inputs
    from tpubuild.tpu.hlo import function_hlo
    from tpubuild.tpu.twin import make_cpu_twin

    model = SavedModel.load(dense_placed["signature"], TAGS)
    wrapper = model.signatures["serving_default"]
    (body,) = model.callees(wrapper)
    assert isinstance(bound_inputs(model, body), list) and len(bound_inputs(model, body)) == 3
    (call,) = [n for n in model.functions[wrapper].node_def if n.op == "TPUPartitionedCall"]
    handle = model.functions[wrapper].node_def.add(name="own_handle", op="VarHandleOp")
    handle.attr["dtype"].type = 1
    handle.attr["shape"].shape.unknown_rank = True
    handle.attr["shared_name"].s = b"own_handle"
    call.input[1] = "own_handle:resource:0"
    model.invalidate()
    edited = tmp_path / "edited"
    edited.mkdir()
    model.save(edited)
    why = bound_inputs(SavedModel.load(edited, TAGS), body)
    assert why == f"argument {model.functions[body].signature.input_arg[1].name}: {wrapper} passes it from " \
                  "'own_handle:resource:0', not from an argument", why
    make_cpu_twin(edited, tmp_path / "twin", TAGS)
    assert function_hlo(tmp_path / "twin", TAGS, [body])[body] == {"error": f"{why}; no HLO"}


def test_unplaced_model_is_all_cpu(runner: Runner, dense: Path) -> None:
    got = verify_and_report(runner, dense, dense, [])
    cost = got["report"]["cost"]
    assert cost["tpu"] == 0 and cost["cpu"] == cost["total"] > 0
    assert cost["tpu_functions"] == [] and got["report"]["hlo"] == {}
    params = got["report"]["parameters"]["source"]
    assert params == {"float32": {"tensors": 3, "elements": 64 * 128 + 128 + 128 * 10, "bytes": 4 * 9600}}


def test_int8_report_shows_a_quarter_of_the_parameter_bytes(runner: Runner, dense: Path) -> None:
    runner.inputs["source"] = dense
    quantized, _ = runner.run("quantize", dense, {
        "tags": TAGS, "method": "WEIGHT_ONLY", "signature_keys": ["serving_default"], "op_set": "XLA",
        "representative_datasets": {},
    })
    got = verify_and_report(runner, dense, quantized, ["quantize"])
    report = got["report"]
    source_bytes = report_format.parameter_bytes(report["parameters"]["source"])
    artifact_bytes = report_format.parameter_bytes(report["parameters"]["artifact"])
    # int8 weights (9472 B) + the float32 bias (512 B) against 9600 float32 parameters.
    assert (source_bytes, artifact_bytes) == (38400, 9472 + 512)
    assert report["parameters"]["artifact"]["int8"]["elements"] == 9472
    assert report["quantization"]["method"] == "WEIGHT_ONLY"
    text = report_format.to_text(report)
    assert "Parameters: artifact 9.8 KiB, source 37.5 KiB; ratio 0.260\n" in text
    assert "Verification: passed (int8 tolerances: rtol 0.05, atol 0.001)" in text
    assert "| **all** | | 37.5 KiB | | 9.8 KiB (ratio 0.260) |" in (got["dir"] / "tpubuild-report.md").read_text()


def test_difference_between_two_reports(runner: Runner, dense: Path) -> None:
    old = verify_and_report(runner, dense, dense, [])["report"]
    # The formatting is under test: pin the measured error (0 here, but a TF float result
    # that may be a few ulps on another CPU) so the expected text is exact.
    old["verify"]["max_abs_error"] = 0.0
    new = json.loads(json.dumps(old))
    new["size"]["artifact"]["total"] = old["size"]["artifact"]["total"] // 2
    new["verify"]["max_abs_error"] = 0.25
    diff = report_format.difference(old, new)
    assert diff["size"] == {"old": old["size"]["artifact"]["total"], "new": old["size"]["artifact"]["total"] // 2}
    assert diff["max_abs_error"] == {"old": 0.0, "new": 0.25}
    lines = report_format.difference_text(diff, "version 1", "version 2").splitlines()
    assert lines[0] == "                      version 1      version 2  change"
    assert lines[1] == f"size             {report_format.human_bytes(diff['size']['old']):>14} {report_format.human_bytes(diff['size']['new']):>14}  x0.500"
    assert lines[-1] == "max_abs_error                 0           0.25"


def test_the_bfloat16_line_claims_only_what_the_rewrite_recorded():
    # A scope whose only float op is filterlisted: nothing computes in bfloat16, and the
    # line says so instead of listing the variables as if the model had been converted.
    kept_only = {"scope": "TPU", "variables": ["w"], "converted_ops": {},
                 "kept_float32": {"filterlist": {"Softmax": 1}, "no_bfloat16_cpu_kernel": {"Erfinv": 2}}}
    line = report_format.bfloat16_line(kept_only)
    assert "ops converted: none (nothing computes in bfloat16)" in line, line
    assert line.endswith("kept float32: Softmax 1 (filterlist), Erfinv 2 (no bfloat16 CPU kernel)"), line
    # An XlaCallModule counts as converted only with the StableHLO ops that changed inside it.
    module = {"function": "tpu_func", "node": "call", "converted_ops": {"stablehlo.add": 1},
              "kept_float32": {"stablehlo.custom_call @f": {"count": 1, "reason": "a custom call"}}}
    line = report_format.bfloat16_line({**kept_only, "converted_ops": {"XlaCallModule": 1},
                                         "kept_float32": {}, "xla_call_modules": [module]})
    assert "ops converted: XlaCallModule 1; XlaCallModule call in tpu_func computes in bfloat16: stablehlo.add 1" in line
    assert line.endswith("kept float32: stablehlo.custom_call @f 1 in XlaCallModule call in tpu_func (a custom call)"), line
