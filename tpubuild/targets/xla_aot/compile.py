"""The XLA AOT compiler's process: `python -m tpubuild.targets.xla_aot.compile JOBS RESULTS`.

Runs what `saved_model_cli aot_compile_cpu` runs (tensorflow/python/tools/saved_model_cli.py
`aot_compile_cpu` -> saved_model_aot_compile.py `aot_compile_cpu_meta_graph_def`), one job
per (signature, batch), with three changes, each for a reason:
  * the signature's inputs get the job's batch size as dimension 0 first: tfcompile needs
    fully defined shapes (`_replace_input_placeholders_with_default_values` raises otherwise),
    and the feed shapes of its config come from the signature;
  * the tf2xla config lists feeds and fetches sorted by name: the wheel's
    `_signature_to_tf2xla_config` walks `signature_def.inputs.items()`, a protobuf map whose
    order changes from process to process, and the argument order of the generated class
    (so the header and object bytes) follows it;
  * `_pywrap_tfcompile.Compile` is called with an entry point named after the C++ class,
    not after the output path (the wheel's `entry_point` embeds `output_prefix`, which would
    put the build directory into the object file's symbols). The metadata object (a
    serialized CompilationResultProto, which the generated header declares but passes as
    nullptr) goes to a scratch path: it is not needed to link, and its bytes differ between
    runs (protobuf map fields serialized in hash order).
Variables are frozen into constants (the CLI's default `--variables_to_feed ''`).

It runs in its own process (xla_aot.run_compiler) because XLA reads XLA_FLAGS once per
process, tfcompile may abort the process on an internal check, and the generated code's
order depends on address-seeded hashing, which that process runs with ASLR off, a fixed
environment and working-directory name length. That makes graphs without control flow
compile to the same bytes every time (tests/targets/xla_aot). Known limit: a graph with a
While loop still gets the arguments of the loop's kernel (`call_kernel` in the header) in an
order that changes between runs (seen with tensorflow 2.21: two of three builds differed
there, with ASLR off, one malloc arena or one codegen split); the code is correct either
way, only the bytes differ. The example model unrolls its LSTM, so it is not affected.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from tpubuild.telling import telling_line

# The wheel's aot_compile_cpu_meta_graph_def sets these (single-threaded Eigen: no thread
# pool dependency in the objects; no YNN fusions: their runtime is not in xla_aot_runtime_src).
XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_cpu_experimental_ynn_fusion_type="
UNSUPPORTED = re.compile(r"Detected unsupported operations when trying to compile graph[^:]*:\s*(.*)", re.DOTALL)
UNSUPPORTED_OP = re.compile(r"(\w+) \(No registered '(\w+)' OpKernel")


def compile_job(source: Path, tags: list[str], job: dict[str, Any], out_dir: Path, scratch: Path) -> dict[str, Any]:
    from google.protobuf import text_format
    from tensorflow.compiler.tf2xla import tf2xla_pb2
    from tensorflow.python import _pywrap_tfcompile
    from tensorflow.python.framework import dtypes
    from tensorflow.python.tools import saved_model_aot_compile as aot
    from tensorflow.python.tools import saved_model_utils

    key, batch = job["signature"], job["batch"]
    meta_graph = saved_model_utils.get_meta_graph_def(str(source), ",".join(tags))
    if key not in meta_graph.signature_def:
        return {"error": f"signature {key!r} is not in the source SavedModel"}
    signature = meta_graph.signature_def[key]
    for name in sorted(signature.inputs):
        problem = _fix_batch(name, signature.inputs[name], batch, dtypes)
        if problem:
            return {"error": f"signature {key!r} input {name!r}: {problem}"}
    work = scratch / job["prefix"]
    graph_path, config_path = aot.freeze_model(
        checkpoint_path=str(source / "variables" / "variables"),
        meta_graph_def=meta_graph,
        output_prefix=str(work),
        signature_def_key=key,
        variables_to_feed=[],
    )
    still_variables = _variable_nodes(graph_path)
    if still_variables:
        return {"error": f"signature {key!r} batch {batch}: the frozen graph still reads variable "
                         f"{still_variables[0]!r}: freezing did not turn the weights into constants"}
    config = text_format.Parse(Path(config_path).read_text(), tf2xla_pb2.Config())
    feeds = sorted(config.feed, key=lambda f: f.name)
    fetches = sorted(config.fetch, key=lambda f: f.name)
    del config.feed[:], config.fetch[:]
    config.feed.extend(feeds)
    config.fetch.extend(fetches)
    Path(config_path).write_text(text_format.MessageToString(config))
    prefix = out_dir / job["prefix"]
    try:
        _pywrap_tfcompile.Compile(
            graph=graph_path,
            config=config_path,
            cpp_class=job["cpp_class"],
            target_triple="x86_64-pc-linux",
            target_cpu="",  # generic x86-64: the objects do not depend on the building CPU
            entry_point=re.sub("[^0-9a-zA-Z]+", "_", "__xla_" + job["cpp_class"]),
            out_function_object=f"{prefix}.o",
            out_header=f"{prefix}.h",
            out_metadata_object=str(work / "metadata.o"),
            out_constant_buffers_object=f"{prefix}_constants.o",
            gen_name_to_index=True,
            gen_program_shape=False,
        )
    except Exception as exc:  # noqa: BLE001 - the pybind wrapper raises the C++ Status as a plain exception
        return {"error": f"signature {key!r} batch {batch}: {describe_compile_error(str(exc))}"}
    return {
        "args": [{"name": f.name, "dtype": dtypes.as_dtype(f.type).name} for f in feeds],
        "results": [{"name": f.name, "dtype": dtypes.as_dtype(f.type).name} for f in fetches],
        "inputs": {f.name: _key_of(f.name, "feed_", signature.inputs) for f in feeds},
        "outputs": {f.name: _key_of(f.name, "fetch_", signature.outputs) for f in fetches},
    }


# Ops that read or hold a variable; tfcompile takes only constants (a variable left in the
# graph becomes a feed nobody sets, tensorflow/compiler/aot/tfcompile_main.cc).
VARIABLE_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "VariableV2", "Variable", "ResourceGather"})


def _variable_nodes(graph_path: str) -> list[str]:
    """Names of the variable nodes left in the frozen GraphDef (top level and library)."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(Path(graph_path).read_bytes())
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sorted(n.name for n in nodes if n.op in VARIABLE_OPS)


def _fix_batch(name: str, info: Any, batch: int, dtypes: Any) -> str | None:
    """Set dimension 0 to `batch`; a reason when the input cannot be given a static shape."""
    if info.dtype == dtypes.string.as_datatype_enum:
        return "string inputs cannot be compiled by tfcompile (XLA has no string type)"
    if info.tensor_shape.unknown_rank:
        return "unknown rank; tfcompile needs a static shape"
    dims = info.tensor_shape.dim
    if not dims:
        return None
    if dims[0].size not in (-1, batch):
        return f"dimension 0 is fixed at {dims[0].size}, not batch size {batch}"
    dims[0].size = batch
    unknown = [i for i, d in enumerate(dims) if d.size < 0]
    if unknown:
        shape = "(" + ", ".join(str(d.size) for d in dims) + ")"
        return f"shape {shape} has unknown dimension {unknown[0]}; only dimension 0 is fixed by batch_sizes"
    return None


def _key_of(config_name: str, prefix: str, tensors: Any) -> str:
    """The signature key a feed/fetch came from (the wheel replaces '/' by '_' and adds a prefix)."""
    return next(k for k in tensors if prefix + k.replace("/", "_") == config_name)


def describe_compile_error(message: str) -> str:
    """One line from tfcompile's Status text: the unsupported ops when it says so."""
    found = UNSUPPORTED.search(message)
    if found:
        ops = sorted({m.group(2) for m in UNSUPPORTED_OP.finditer(found.group(1))})
        if ops:
            return f"op {', '.join(ops)} is not supported by XLA's CPU compiler (tfcompile)"
    return telling_line(message) or "tfcompile failed without a message"


def main(argv: list[str]) -> int:
    jobs_file, results_file = Path(argv[0]), Path(argv[1])
    spec = json.loads(jobs_file.read_text())
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), XLA_FLAGS]))
    from tpubuild.quiet import quiet_tensorflow

    quiet_tensorflow()
    results = {}
    scratch = Path(spec["scratch"])
    scratch.mkdir(exist_ok=True)
    for job in spec["jobs"]:
        try:
            results[job["prefix"]] = compile_job(Path(spec["source"]), spec["tags"], job, Path(spec["out_dir"]), scratch)
        except Exception as exc:  # noqa: BLE001 - a one-line error per job; the traceback goes to the log
            traceback.print_exc()
            first = telling_line(str(exc)) or type(exc).__name__
            results[job["prefix"]] = {"error": f"signature {job['signature']!r} batch {job['batch']}: {first}"}
    results_file.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
