"""Reshard stage: the checkpoint (variables/) laid out in data files of at most
`variables.max_shard_size` bytes, so uploads and downloads move them in parallel. The
values, the graph and the object graph are unchanged; runs after every other transform, so
verify checks the files that are published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages import slices
from tpubuild.stages.base import STREAMS_CHECKPOINT, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "reshard",
    options=lambda r: {"tags": slices.tags(r), "max_shard_size": r["variables"]["max_shard_size"]},
    memory=STREAMS_CHECKPOINT,  # copies tensors a chunk at a time (stages/base.py)
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.savedmodel import checkpoint
    from tpubuild.savedmodel.model import SavedModel

    model = SavedModel.load(Path(input_dir), options["tags"])
    model.save(Path(output_dir))
    if not (Path(input_dir) / checkpoint.PREFIX).with_suffix(".index").is_file():
        context.log("reshard: the model has no variables")
        return StageResult(summary={"before": 0, "shards": 0, "max_shard_size": options["max_shard_size"]}, warnings=[])
    summary = {**checkpoint.reshard(Path(input_dir), Path(output_dir), options["max_shard_size"]),
               "max_shard_size": options["max_shard_size"]}
    context.log(f"reshard: {summary['before']} -> {summary['shards']} data files of at most "
                f"{options['max_shard_size']} bytes")
    warnings = []
    if summary["oversized"]:
        warnings.append(f"variables.max_shard_size: {summary['oversized']} tensor(s) larger than "
                        f"{options['max_shard_size']} bytes are each a data file of their own "
                        f"(largest {summary['largest_shard']} bytes)")
    return StageResult(summary=summary, warnings=warnings)
