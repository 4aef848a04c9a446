"""Stage `xla_aot`: an ahead-of-time compiled C++ library per signature and batch size.

TensorFlow's XLA AOT compiler (tfcompile, as `saved_model_cli aot_compile_cpu` runs it)
compiles each listed signature of the source SavedModel, its inputs fixed at each batch
size and its variables frozen, into a header and two object files (code, constants). The
stage writes them, one CMake snippet for the whole target (`xla_aot.cmake`) and the facts
(`xla_aot.json`: classes, files, argument and result names, dtypes and shapes). The bytes
are the same on every build of the same input (see targets/xla_aot/compile.py for how).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import SOURCE, StageContext, StageResult, StageSpec


def target_options(recipe: dict[str, Any]) -> dict[str, Any]:
    """`targets.xla_aot` of the canonical recipe (defaults filled by config/canonical.py)."""
    return slices.targets(recipe)["xla_aot"]


SPEC = StageSpec(
    "xla_aot",
    # rtol/atol are verify_xla_aot's: the libraries do not depend on them.
    options=lambda r: {
        "tags": slices.tags(r),
        "signatures": target_options(r)["signatures"],
        "batch_sizes": target_options(r)["batch_sizes"],
    },
    consumes=(SOURCE,),
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.atomic import write_text_atomic
    from tpubuild.savedmodel.model import readable_copy
    from tpubuild.targets.xla_aot import libraries as xla_aot
    from tpubuild.targets.xla_aot import runtime as xla_aot_runtime

    source = context.inputs["source"]
    batch_sizes = options["batch_sizes"]
    if not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise StageError(f"targets.xla_aot.batch_sizes must be a non-empty list of integers >= 1, got {batch_sizes!r}")
    jobs = xla_aot.plan_jobs(list(options["signatures"]), batch_sizes)
    with tempfile.TemporaryDirectory(prefix=".xla-aot-", dir=Path(output_dir).parent) as scratch:
        # The compiler freezes variables in a session: one handle per weight
        # (savedmodel/variable_handles.py).
        readable = readable_copy(Path(source), options["tags"], Path(scratch))
        results = xla_aot.run_compiler(readable, options["tags"], jobs, Path(output_dir), context.log)
    missing = {"error": "the compiler returned no result"}
    failed = [results.get(j.prefix, missing)["error"] for j in jobs if "error" in results.get(j.prefix, missing)]
    if failed:
        raise StageError(f"xla_aot: {failed[0]}")
    libraries = [_library(job, results[job.prefix], Path(output_dir)) for job in jobs]
    runtime = xla_aot_runtime.runtime_names([(Path(output_dir) / lib["header"]).read_text() for lib in libraries])
    write_text_atomic(Path(output_dir) / xla_aot.CMAKE_SNIPPET, xla_aot.cmake_snippet(libraries, runtime))
    facts = {"namespace": xla_aot.NAMESPACE, "cmake": xla_aot.CMAKE_SNIPPET,
             "runtime_target": xla_aot.RUNTIME_LIBRARY, "runtime_sources": runtime, "libraries": libraries}
    write_text_atomic(Path(output_dir) / xla_aot.FACTS_JSON, json.dumps(facts, indent=2, sort_keys=True) + "\n")
    context.log(f"xla_aot: {len(libraries)} libraries ({', '.join(lib['cpp_class'] for lib in libraries)})")
    summary = {
        "libraries": [
            {key: lib[key] for key in ("signature", "batch", "cpp_class", "header", "objects", "cmake_target")}
            | {"bytes": sum((Path(output_dir) / f).stat().st_size for f in lib["files"])}
            for lib in libraries
        ],
    }
    return StageResult(summary=summary)


def _library(job: Any, result: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """The facts of one (signature, batch): names, files, shapes (from the header tfcompile wrote)."""
    from tpubuild.targets.xla_aot import libraries as xla_aot

    header = f"{job.prefix}.h"
    objects = [f"{job.prefix}.o", f"{job.prefix}_constants.o"]
    arg_shapes, result_shapes = xla_aot.header_shapes((output_dir / header).read_text())
    if len(arg_shapes) != len(result["args"]) or len(result_shapes) != len(result["results"]):
        raise StageError(f"xla_aot: {header}: the header's signature does not match the compiler's config")
    args = [{**a, "shape": s, "input": result["inputs"][a["name"]]} for a, s in zip(result["args"], arg_shapes)]
    outs = [{**r, "shape": s, "output": result["outputs"][r["name"]]}
            for r, s in zip(result["results"], result_shapes)]
    return {
        "signature": job.signature, "batch": job.batch, "prefix": job.prefix, "cpp_class": job.cpp_class,
        "cmake_target": job.library, "header": header, "objects": objects, "files": [header, *objects],
        "args": args, "results": outs,
    }
