"""`tpubuild convert`: run a recipe's transform stages in sequence and publish OUT_DIR atomically.

No cache and no engine: each stage writes into a fresh directory under a temp dir beside
OUT_DIR, and the last one is renamed into place, so a failure leaves OUT_DIR untouched.
"""

from __future__ import annotations

import importlib
import os
import shutil
import stat
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
    if out.is_relative_to(src):
        # Its work directory and its output would be read back as part of the input.
        raise UsageError(f"{out}: inside the SavedModel to convert ({src}); the output goes outside the input")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: output directory exists and is not empty")
    if any(s.name == "tpu" for s in plan(canonical)):
        _refuse_converted(src, canonical["model"]["tags"])
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:  # a file where a directory of OUT_DIR's path should be, no permission
        raise UsageError(f"{out}: cannot be made: {exc.strerror or exc} ({exc.filename or out.parent})") from None

    result = ConvertResult()
    outputs: dict[str, Path] = {"source": src}
    summaries: dict[str, dict[str, Any]] = {}
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
        _publish(current, out, work, canonical["model"]["tags"], src)
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


def _publish(model_dir: Path, out: Path, work: Path, tags: list[str], src: Path) -> None:
    """Rename the final model into place; the source itself is re-saved, never moved."""
    if not model_dir.is_relative_to(work):
        from tpubuild.savedmodel.model import SavedModel

        copy = work / "unchanged"
        copy.mkdir()
        SavedModel.load(model_dir, tags).save(copy)
        model_dir = copy
    _modes_of(src, model_dir)
    try:
        # rename(2) replaces an empty directory atomically; a non-empty one makes it fail.
        os.replace(model_dir, out)
    except OSError as exc:
        raise ConversionError(f"{out}: cannot publish the converted model: {exc.strerror}") from None


def _modes_of(src: Path, model_dir: Path) -> None:
    """Give each file and directory of the converted model the permissions of the input's
    of the same kind at the same path (else the umask's). The stages write saved_model.pb
    as atomic.write_atomic does, 0600 as mkstemp makes it: right for the cache, not for a
    model the user asked for beside theirs."""
    umask = os.umask(0o022)
    os.umask(umask)

    def give(path: Path) -> None:
        st = os.lstat(path)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return  # a stage writes no link; none is followed
        try:
            theirs = os.lstat(src / path.relative_to(model_dir))
        except OSError:
            theirs = None
        if theirs is not None and stat.S_IFMT(theirs.st_mode) == stat.S_IFMT(st.st_mode):
            mode = stat.S_IMODE(theirs.st_mode)
        else:
            mode = (0o777 if stat.S_ISDIR(st.st_mode) else 0o666) & ~umask
        os.chmod(path, mode)

    paths = [model_dir]
    for directory, dirs, files in os.walk(model_dir):
        paths += [Path(directory) / name for name in (*dirs, *files)]
    for path in reversed(paths):  # what is inside first: a directory made read-only is still walked
        give(path)
