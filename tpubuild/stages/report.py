"""Stage `report`: the conversion report (cost split, sizes, parameters, verification, HLO).

Writes `tpubuild-report.json`, `tpubuild-report.md` and `hlo/<function>.txt` into its
output directory; the engine copies them into each published version.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from tpubuild.report.formats import REPORT_JSON, REPORT_MD
from tpubuild.stages import slices
from tpubuild.stages.base import LOADS_MODEL, MODEL, SOURCE, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "report",
    runs_models=True,
    options=lambda r: {"tags": slices.tags(r)},
    consumes=(MODEL, SOURCE),
    summaries=("dataset", "quantize", "tpu", "bfloat16", "io_shape", "batch", "reshard", "verify"),
    # It embeds verify's measured errors.
    machine_dependent=lambda options: True,
    memory=LOADS_MODEL,  # its peak memory (stages/base.py, measured there)
)

HLO_DIR = "hlo"
# Summaries of earlier stages that belong in the report as they are.
STAGE_SECTIONS = ("dataset", "tpu", "bfloat16", "io_shape", "batch", "reshard")


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.report import compat, cost, params
    from tpubuild.report.formats import REPORT_SCHEMA, to_json, to_markdown
    from tpubuild.savedmodel.model import SavedModel

    tags = options["tags"]
    artifact = SavedModel.load(input_dir, tags)
    source_dir = context.inputs.get("source", input_dir)
    source = SavedModel.load(source_dir, tags)
    estimate = cost.estimate(artifact)
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "cost": estimate.as_dict(),
        "size": {"source": params.sizes(source_dir), "artifact": params.sizes(input_dir)},
        "parameters": {
            "source": params.parameters(source)["total"],
            "artifact": params.parameters(artifact)["total"],
        },
        "verify": context.results.get("verify"),
        "quantization": context.results.get("quantize"),
        "stages": {name: context.results[name] for name in STAGE_SECTIONS if name in context.results},
        "hlo": {},
        "min_tensorflow": _min_tensorflow(compat.required_version(artifact.meta_graph)),
    }
    tpu_names = [row["function"] for row in report["cost"]["tpu_functions"]]
    if tpu_names:
        report["hlo"] = _write_hlo(input_dir, output_dir, tags, tpu_names, artifact.aliases, context.log)
    _write(output_dir / REPORT_JSON, to_json(report))
    _write(output_dir / REPORT_MD, to_markdown(report))
    warnings = [f"cost model: {w}" for w in estimate.warnings]
    warnings += [
        f"no HLO for TPU function {name}: {entry['error']}"
        for name, entry in report["hlo"].items() if "error" in entry
    ]
    return StageResult(summary=_summary(report), warnings=warnings)


def _write_hlo(
    artifact: Path, output_dir: Path, tags: list[str], names: list[str], aliases: dict[str, str],
    log: Any = lambda message: None,
) -> dict[str, dict[str, str]]:
    """HLO of each TPU function, from the artifact's CPU twin (TPU calls cannot run here)."""
    from tpubuild.tpu.hlo import function_hlo
    from tpubuild.tpu.twin import cpu_twin, take_loaded

    (output_dir / HLO_DIR).mkdir()
    with tempfile.TemporaryDirectory(prefix=".twin-", dir=output_dir) as scratch:
        # In verify's worker (engine/loop.py HANDOFF) the twin verify made, and loaded and
        # ran, is reused: neither made nor loaded again.
        twin = cpu_twin(artifact, tags, Path(scratch))
        loaded = take_loaded(twin, tags)
        if loaded is not None:
            log("HLO from the CPU twin verify loaded and ran")
        found = function_hlo(twin, tags, names, loaded)
    entries = {}
    for name in names:
        label = aliases.get(name) or name
        if "hlo" in found[name]:
            relative = f"{HLO_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.txt"
            _write(output_dir / relative, found[name]["hlo"])
            entries[label] = {"function": name, "file": relative}
        else:
            entries[label] = {"function": name, "error": found[name]["error"]}
    return entries


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (the engine puts them in the manifest)."""
    verify = report["verify"] or {}
    return {
        "cost": {k: report["cost"][k] for k in ("total", "tpu", "cpu")},
        "size": {"source": report["size"]["source"]["total"], "artifact": report["size"]["artifact"]["total"]},
        "max_abs_error": verify.get("max_abs_error"),
        # The worst argmax agreement over the outputs that have one (classifiers).
        "argmax_agreement": min((o["argmax_agreement"] for o in verify.get("outputs", [])
                                 if o.get("argmax_agreement") is not None), default=None),
        "parameters": {dtype: row["elements"] for dtype, row in sorted(report["parameters"]["artifact"].items())},
        "min_tensorflow": report["min_tensorflow"],
        "files": [REPORT_JSON, REPORT_MD] + [e["file"] for e in report["hlo"].values() if "file" in e],
    }


def _min_tensorflow(found: tuple[str, str]) -> dict[str, str]:
    """The oldest TensorFlow release whose op registry accepts the artifact, and why."""
    version, reason = found
    return {"version": version, "reason": reason}


def _write(path: Path, text: str) -> None:
    from tpubuild.atomic import write_atomic

    write_atomic(path, text.encode())
