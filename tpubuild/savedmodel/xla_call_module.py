"""jax2tf's XlaCallModule op: the StableHLO module it holds, read and written back.

jax2tf's native serialization puts a whole JAX computation into one `XlaCallModule` node:
attr `module` holds a StableHLO portable artifact (VHLO bytecode whose producer string is
`StableHLO_vX.Y.Z`), `Tin`/`Tout` the dtypes of the module's arguments and results (the
module's `main` may take a leading platform-index argument and a token first, which Tin
and Tout leave out), `Sout` the result shapes. TensorFlow's kernel reads the module with
`mlir::stablehlo::deserializePortableArtifact` (tensorflow/compiler/tf2xla/kernels/
xla_call_module_loader.cc, XlaCallModuleLoader::LoadModule); JAX writes it with
`serialize_portable_artifact(module, target_version, use_mixed_serialization)`
(jax/_src/export/_export.py, `_module_to_bytecode`).

The MLIR Python bindings that can edit a module ship with jaxlib (TensorFlow's wheel only
converts whole artifacts to and from text): a model holding an XlaCallModule was exported
with jax, so jax is there wherever its recipe builds; without it, `open_module` says so.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator

from tensorflow.core.framework.node_def_pb2 import NodeDef

OP = "XlaCallModule"
_PRODUCER = re.compile(rb"StableHLO_v(\d+\.\d+\.\d+)")


class ModuleError(Exception):
    """The module cannot be read, edited or written back; the message says why (one line)."""


def artifact_version(data: bytes) -> str | None:
    """The StableHLO version a portable artifact was written for (its producer string)."""
    found = _PRODUCER.search(data[:64])
    return found.group(1).decode() if found else None


@contextmanager
def open_module(node: NodeDef) -> Iterator[Any]:
    """The node's module as an MLIR `ir.Module`, inside its MLIR context (and a default
    location, so that ops built while it is open need none)."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax.extend import mlir as jax_extend_mlir
        from jaxlib.mlir import ir
    except ImportError as exc:
        raise ModuleError(f"reading its StableHLO needs jax's MLIR bindings ({exc}); install jax") from None
    with jax_mlir.make_ir_context(), ir.Location.unknown():
        try:
            module = jax_extend_mlir.deserialize_portable_artifact(node.attr["module"].s)
        except Exception as exc:  # the bindings raise their own error types
            raise ModuleError(f"its StableHLO module does not deserialize: {_first_line(exc)}") from None
        yield module


def write_module(node: NodeDef, module: Any) -> None:
    """Serialize `module` into the node, for the StableHLO version the node's artifact was
    written for (the consumer already reads that one), the way JAX chose: mixed
    serialization when the module uses the Shardy partitioner. The result must be
    readable by this TensorFlow's own deserializer wherever the original is."""
    from jax.extend import mlir as jax_extend_mlir

    original = node.attr["module"].s
    version = artifact_version(original)
    if version is None:
        raise ModuleError("its artifact names no StableHLO version")
    mixed = node.attr["use_shardy_partitioner"].b if "use_shardy_partitioner" in node.attr else False
    try:
        data = jax_extend_mlir.serialize_portable_artifact(module, version, mixed)
    except Exception as exc:
        raise ModuleError(f"the rewritten module does not serialize for StableHLO {version}: {_first_line(exc)}") from None
    # TensorFlow's Python deserializer registers fewer dialects than its kernel (no Shardy
    # `sdy`), so it judges the rewrite only where it reads the original.
    if tensorflow_reads(original) and not tensorflow_reads(data):
        raise ModuleError("this TensorFlow's StableHLO cannot read the rewritten module")
    node.attr["module"].s = data


def tensorflow_reads(data: bytes) -> bool:
    """Whether TensorFlow's StableHLO (the version its XlaCallModule kernel links)
    deserializes `data`, through the same deserializePortableArtifact."""
    from tensorflow.compiler.mlir.stablehlo import stablehlo as tf_stablehlo

    try:
        tf_stablehlo.deserialize_portable_artifact_str(data)
    except Exception:
        return False
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# A source position as MLIR prints it: "file":line:col, optionally " to [line:]col".
_FILE_LOCATION = re.compile(r'"(?:[^"\\]|\\.)*":\d+:\d+(?: to (?:\d+)?:\d+)?')
# What a source position becomes: a FileLineColLoc still (it may sit inside a NameLoc or a
# CallSiteLoc, where `unknown` is not accepted), naming no file.
NO_SOURCE = '"":0:0'


def strip_source_locations(node: NodeDef) -> bool:
    """Replace every source position in the node's module with one fixed position; op names
    (NameLocs, which XLA keeps as HLO op_name metadata for profiles) stay. Returns whether
    the module changed.

    JAX records where each op was traced: the exporting script's absolute path and line
    numbers, and for code autograph converted, a temporary file with a random name
    (tensorflow/python/autograph/pyct/loader.py). The bytes then change with a comment
    edit, the checkout's path and every run; the computation does not."""
    from jaxlib.mlir import ir

    with open_module(node) as module:
        text = module.operation.get_asm(enable_debug_info=True)
        stripped = _FILE_LOCATION.sub(NO_SOURCE, text)
        if stripped == text:
            return False
        try:
            rewritten = ir.Module.parse(stripped)
        except Exception as exc:
            raise ModuleError(f"its StableHLO module does not read back without source positions: {_first_line(exc)}") from None
        write_module(node, rewritten)
    return True
