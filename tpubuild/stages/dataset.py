"""Stage `dataset`: turn npz / generator representative datasets into TFRecord files.

Writes `<signature_key>.tfrecord` per generated source; the quantize stage reads them from
`context.inputs["dataset"]`. `tfrecord_file_path` sources are used as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages import slices
from tpubuild.stages.base import MODEL, RUNS_USER_CODE, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "dataset",
    options=lambda r: {"tags": slices.tags(r), "datasets": slices.generated_datasets(r)},
    # npz files, generator modules and the data files a generator declares in `deps:`;
    # a generator's own imports are discovered.
    files=lambda r: sorted({f for s in slices.generated_datasets(r).values()
                            for f in ([s["npz"]] if "npz" in s else [s["module_file"], *s.get("deps", [])])}),
    consumes=(MODEL,),  # the signatures' input specs
    runs_user_code=True,
    memory=RUNS_USER_CODE,  # its peak memory (stages/base.py, measured there)
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    import os
    import sys

    # Generators are importable from the workspace root (`pkg.module:function`), and so
    # are their own imports. The engine runs this stage in a fresh process that records
    # every workspace module imported, so those imports are inputs of this stage too.
    sys.path.insert(0, str(context.workspace))
    from tpubuild.quantize import datasets
    from tpubuild.savedmodel.model import SavedModel

    model = SavedModel.load(input_dir, options["tags"])
    summary: dict[str, Any] = {"datasets": {}}
    warnings = []
    for key, source in sorted(options["datasets"].items()):
        specs = datasets.signature_inputs(model, key)
        if "npz" in source:
            where = f"representative_datasets.{key}: {source['npz']}"
            samples = datasets.npz_samples(context.workspace / source["npz"], specs, where)
            origin = source["npz"]
        else:
            where = f"representative_datasets.{key}: {source['generator']}"
            module_file = context.workspace / source["module_file"]
            # A relative path the generator opens resolves beside its module, as an export
            # script's does beside the script (tpubuild/user_code.py).
            os.chdir(module_file.parent)
            samples = datasets.generator_samples(
                source["generator"], module_file, source["num_samples"], specs, where, context.workspace,
            )
            origin = source["generator"]
        if len(samples) < datasets.RECOMMENDED_SAMPLES:
            warnings.append(
                f"{where}: only {len(samples)} samples; the converter recommends at least "
                f"{datasets.RECOMMENDED_SAMPLES} for calibration"
            )
        datasets.write_tfrecord(output_dir / f"{key}.tfrecord", key, samples)
        summary["datasets"][key] = {"source": origin, "samples": len(samples)}
    for message in warnings:
        context.log(f"warning: {message}")
    return StageResult(summary=summary, warnings=warnings)
