"""`tpubuild convert`: run a recipe's transform stages in sequence and publish OUT_DIR atomically.

No cache and no engine: each stage writes into a fresh directory under a temp dir beside
OUT_DIR, and the last one is renamed into place, so a failure leaves OUT_DIR untouched.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tpubuild.errors import ConversionError, UsageError
from tpubuild.pipeline import TRANSFORMS, entry, plan
from tpubuild.stages.base import StageContext

# Stages convert runs: the model-changing ones after the source, plus the datasets quantize reads.
RUNNABLE = (TRANSFORMS - {"source", "export"}) | {"dataset"}


@dataclass
class StageRun:
    name: str
    summary: dict[str, Any]
    warnings: list[str]


@dataclass
class ConvertResult:
    ran: list[StageRun] = field(default_factory=list)


def convert(
    src: Path,
    out: Path,
    canonical: dict[str, Any],
    root: Path,
    recipe_file: Path,
    log: Callable[[str], None] = lambda message: None,
) -> ConvertResult:
    """Convert the SavedModel `src` as the canonical recipe says and publish it at `out`."""
    src, out = Path(src).resolve(), Path(out).resolve()
    if not (src / "saved_model.pb").is_file():
        raise UsageError(f"{src}: not a SavedModel directory (no saved_model.pb)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: output directory exists and is not empty")
    if any(s.name == "tpu" for s in plan(canonical)):
        _refuse_converted(src, canonical["model"]["tags"])
    out.parent.mkdir(parents=True, exist_ok=True)

    result = ConvertResult()
    outputs: dict[str, Path] = {"source": src}
    summaries: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        current = src
        for index, stage in enumerate(s for s in plan(canonical) if s.name in RUNNABLE):
            run = _run_function(stage.name)
            stage_out = work / f"{index}-{stage.name}"
            stage_out.mkdir()
            log(f"{stage.name}: running")
            # What the engine would hand the stage: its consumed outputs and summaries only.
            context = StageContext(
                workspace=Path(root),
                inputs={role: outputs[name] for role, name in stage.consumes.items() if name in outputs},
                results={name: summaries[name] for name in stage.summaries if name in summaries},
                log=log,
            )
            outcome = run(current, stage_out, stage.options, context)
            outputs[stage.name] = stage_out
            summaries[stage.name] = outcome.summary
            result.ran.append(StageRun(stage.name, outcome.summary, list(outcome.warnings)))
            if stage.name in TRANSFORMS:
                current = stage_out
        _publish(current, out, work, canonical["model"]["tags"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _refuse_converted(src: Path, tags: list[str]) -> None:
    """A SavedModel that already holds TPU placement (the output of a conversion, ours or
    the Cloud TPU Inference Converter's) cannot be placed again: say so instead of the
    nested-call or metadata errors the tpu stage would meet deeper down."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.placement import METADATA, TPU_CALL

    model = SavedModel.load(src, tags)
    holders = [("the graph", model.meta_graph.graph_def.node),
               *((f"function {name}", f.node_def) for name, f in sorted(model.functions.items()))]
    for where, nodes in holders:
        for node in nodes:
            if node.op in (TPU_CALL, METADATA):
                raise ConversionError(f"{src}: already converted for the TPU ({where} holds {node.op} node "
                                      f"{node.name}); convert the SavedModel it was made from")


def _run_function(name: str) -> Callable[..., Any]:
    """The stage's `run`, imported in this process (convert runs stages in-process)."""
    module_name, _, function = entry(name).partition(":")
    return getattr(importlib.import_module(module_name), function)


def _publish(model_dir: Path, out: Path, work: Path, tags: list[str]) -> None:
    """Rename the final model into place; the source itself is re-saved, never moved."""
    if not model_dir.is_relative_to(work):
        from tpubuild.savedmodel.model import SavedModel

        copy = work / "unchanged"
        copy.mkdir()
        SavedModel.load(model_dir, tags).save(copy)
        model_dir = copy
    try:
        # rename(2) replaces an empty directory atomically; a non-empty one makes it fail.
        os.replace(model_dir, out)
    except OSError as exc:
        raise ConversionError(f"{out}: cannot publish the converted model: {exc.strerror}") from None
