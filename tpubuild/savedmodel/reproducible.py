"""Byte-reproducible SavedModels: the same export gives the same bytes in any process.

`tf.saved_model.save` names every traced function `<name>_<uid>`, where uid comes from a
counter TensorFlow bumps for every graph object the process creates
(`ops.uid()` in tensorflow/python/framework/ops.py), so an export run after other work,
or by another tpubuild worker, gets other names. Custom gradients are registered under
`CustomGradient-<uid>` (tensorflow/python/ops/custom_gradient.py, `generate_name`), a
captured variable's input records the captured tensor's uid as its
`_user_specified_name`, the library comes out in no fixed order, and fingerprint.pb holds
a random uuid. The rest (node names, the object graph, the variables bundle) came out
byte-identical from processes with different counters and hash seeds
(tests/savedmodel/test_reproducible.py compares every file).

jax2tf's `XlaCallModule` holds a StableHLO module whose locations name the exporting
script's path and lines and autograph's randomly named temporary files: they are replaced
by one fixed position (`xla_call_module.strip_source_locations`), op names kept, before the
functions are named from their content.

Not covered: a call node's `config_proto` attr holds the tracing process's device counts
(`context.config` in tensorflow/python/eager/context.py), so an export with a visible
GPU differs from one without; export workers should run with the same devices.

`make_reproducible` renames each such function to `<name>_<10 digits>`, the digits taken
from a digest of what the function is: its body with its callees already renamed (so
the scheme is a Merkle tree over the call graph), the object graph's record of it, its
alias and its gradient. Names TF never numbered, and names already in that form, are kept,
so the function is idempotent and a name a recipe uses survives later stages. TF's loader
strips `__inference_` and the `_<digits>` suffix the same way for either form
(`_clean_function_name` in tensorflow/python/saved_model/function_deserialization.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from tensorflow.core.framework.attr_value_pb2 import AttrValue
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

from tpubuild.atomic import write_atomic
from tpubuild.errors import ConversionError

SAVED_MODEL_PB = "saved_model.pb"
FINGERPRINT_PB = "fingerprint.pb"
CANONICAL_DIGITS = 10
# A process uid never reaches ten digits (it counts graph objects of one process), so a
# ten-digit suffix marks a name this module gave.
_CANONICAL = re.compile(rf"_\d{{{CANONICAL_DIGITS}}}$")
_NUMBERED = re.compile(r"^(?P<base>.+)_\d+$")
# The node attribute that ties an op to a registered custom gradient
# (tensorflow/python/saved_model/function_deserialization.py, _get_gradient_op_type).
GRADIENT_OP_TYPE = "_gradient_op_type"
# A custom gradient's op type as TF generates it; when the gradient was not saved
# (SaveOptions(experimental_custom_gradients=False)) the loader cannot use it anyway, so
# one fixed name replaces the process uid.
_GENERATED_OP_TYPE = re.compile(r"CustomGradient-\d+")
UNSAVED_OP_TYPE = "CustomGradient-unsaved"
USER_SPECIFIED_NAME = "_user_specified_name"

Rename = Callable[[str], str]


def make_reproducible(saved_model_dir: Path) -> None:
    """Rewrite a freshly written SavedModel in place so its bytes depend on its content only.

    Call it on a SavedModel that TensorFlow itself wrote (an export, a re-save), where
    function names carry process counters. Stages that edit protos through
    `SavedModel.save` need no call: they keep the names they were given.
    """
    directory = Path(saved_model_dir)
    pb = directory / SAVED_MODEL_PB
    if not pb.is_file():
        raise ConversionError(f"{directory}: not a SavedModel (no {SAVED_MODEL_PB})")
    data = pb.read_bytes()
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError by version
        raise ConversionError(f"{pb}: cannot parse SavedModel proto: {exc}") from None
    for meta_graph in proto.meta_graphs:
        strip_module_sources(meta_graph)
        canonicalize(meta_graph)
    canonical = proto.SerializeToString(deterministic=True)
    if canonical != data:
        write_atomic(pb, canonical)
        write_fingerprint(directory)  # its hashes cover the pb we just changed
    else:
        make_fingerprint_reproducible(directory)


def strip_module_sources(meta_graph: MetaGraphDef) -> int:
    """Source positions out of every XlaCallModule's StableHLO; returns how many changed.
    A module that cannot be rewritten (no jax here) is left as it is: still correct, only
    not reproducible."""
    from tpubuild.savedmodel.xla_call_module import (
        OP,
        ModuleError,
        strip_source_locations,
    )

    nodes = [n for n in meta_graph.graph_def.node if n.op == OP]
    nodes += [n for f in meta_graph.graph_def.library.function for n in f.node_def if n.op == OP]
    changed = 0
    for node in nodes:
        try:
            changed += strip_source_locations(node)
        except ModuleError:
            continue
    return changed


def canonicalize(meta_graph: MetaGraphDef) -> None:
    """Rename process-numbered functions and custom gradients of one MetaGraphDef in place."""
    library = meta_graph.graph_def.library
    functions = {f.signature.name: f for f in library.function}
    for fdef in functions.values():
        _name_captures_by_position(fdef)
    gradient_of = {g.gradient_func: g.registered_op_type for g in library.registered_gradients}
    op_type_owner = {op_type: fn for fn, op_type in gradient_of.items()}
    order = _callees_first(functions, op_type_owner)
    names: dict[str, str] = {}
    digests: dict[str, str] = {}  # canonical name -> digest of the function kept under it
    op_types: dict[str, str] = {}

    def rename_op_type(op_type: str) -> str:
        if op_type in op_types:
            return op_types[op_type]
        return UNSAVED_OP_TYPE if _GENERATED_OP_TYPE.fullmatch(op_type) else op_type

    for name in order:
        digest = _identity(meta_graph, functions[name], names, rename_op_type)
        new = name if not _needs_name(name) else _canonical_name(name, digest, digests)
        if digests.setdefault(new, digest) != digest:
            raise ConversionError(f"function {name}: its canonical name {new} is taken by another function")
        names[name] = new
        if name in gradient_of:
            op_types[gradient_of[name]] = f"CustomGradient-{digest[:CANONICAL_DIGITS]}"
    _apply(meta_graph, lambda name: names.get(name, name), rename_op_type)


def _name_captures_by_position(fdef: FunctionDef) -> None:
    """Replace the process uid TF records as the "user-specified name" of a captured input.

    A captured variable's placeholder is named after the captured eager tensor's id, which
    counts like function uids. TF reads `_user_specified_name` only for positional
    arguments (`_set_arg_keywords` in
    tensorflow/python/eager/polymorphic_function/tracing_compilation.py, `save.py`'s
    signature placeholders), which a user names and never as a bare number; the
    argument's own name in the signature is as good a name and is a function of position.
    """
    for index, arg in fdef.arg_attr.items():
        value = arg.attr.get(USER_SPECIFIED_NAME)
        if value is not None and value.s.isdigit() and index < len(fdef.signature.input_arg):
            value.s = fdef.signature.input_arg[index].name.encode()


def _needs_name(name: str) -> bool:
    return bool(_NUMBERED.match(name)) and not _CANONICAL.search(name)


def _canonical_name(name: str, digest: str, taken: dict[str, str]) -> str:
    """`<base>_<10 digits of digest>`; another slice of the digest if two functions collide."""
    base = _NUMBERED.match(name)["base"]  # type: ignore[index]
    number = int(digest, 16)
    while True:
        candidate = f"{base}_{number % 10**CANONICAL_DIGITS:0{CANONICAL_DIGITS}d}"
        # Identical functions (same digest) share the name: one definition is kept.
        if taken.get(candidate, digest) == digest:
            return candidate
        number //= 10**CANONICAL_DIGITS
        if number == 0:
            number = int(hashlib.blake2b(candidate.encode()).hexdigest(), 16)


def _callees_first(functions: dict[str, FunctionDef], op_type_owner: dict[str, str]) -> list[str]:
    """Library functions in a post-order of the call graph: every callee before its callers."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise ConversionError(f"function {name}: calls itself ({cycle}); TensorFlow cannot load such a model")
        state[name] = 1
        for callee in sorted(_dependencies(functions[name], functions, op_type_owner)):
            visit(callee, (*path, name))
        state[name] = 2
        order.append(name)

    for name in sorted(functions):
        visit(name, ())
    return order


def _dependencies(fdef: FunctionDef, functions: dict[str, FunctionDef], op_type_owner: dict[str, str]) -> set[str]:
    """The library functions `fdef` names: calls, func-valued attrs, custom gradients."""
    names: set[str] = set()
    op_types: set[str] = set()
    rename_all(fdef, _recorder(names), _recorder(op_types))  # renames nothing, records all
    names |= {op_type_owner[op] for op in op_types if op in op_type_owner}
    return {name for name in names if name in functions and name != fdef.signature.name}


def _recorder(into: set[str]) -> Rename:
    def record(name: str) -> str:
        into.add(name)
        return name

    return record


def _identity(
    meta_graph: MetaGraphDef,
    fdef: FunctionDef,
    names: dict[str, str],
    rename_op_type: Rename,
) -> str:
    """Digest of what a function is, independent of the process that traced it."""
    name = fdef.signature.name
    body = FunctionDef()
    body.CopyFrom(fdef)
    # The base name only: a name this module gave must hash as it did before it was given.
    numbered = _NUMBERED.match(name)
    body.signature.name = numbered["base"] if numbered else name
    rename_all(body, lambda n: names.get(n, n), rename_op_type)
    parts = [body.SerializeToString(deterministic=True)]
    graph = meta_graph.object_graph_def
    if name in graph.concrete_functions:
        record = graph.concrete_functions[name]
        parts.append(record.SerializeToString(deterministic=True))
    parts.append(meta_graph.meta_info_def.function_aliases.get(name, "").encode())
    for gradient in meta_graph.graph_def.library.gradient:
        if gradient.function_name == name:
            parts.append(names.get(gradient.gradient_func, gradient.gradient_func).encode())
    digest = hashlib.blake2b(digest_size=32)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def rename_all(fdef: FunctionDef, rename: Rename, rename_op_type: Rename) -> None:
    """Apply `rename` to every function reference of `fdef` (not its own name)."""
    for node in fdef.node_def:
        rename_node(node, rename, rename_op_type)
    for value in fdef.attr.values():
        _rename_attr(value, rename)
    for arg in fdef.arg_attr.values():
        for value in arg.attr.values():
            _rename_attr(value, rename)


def rename_node(node: NodeDef, rename: Rename, rename_op_type: Rename) -> None:
    """Function calls by op name, func-valued attrs (nested too), custom gradient op types."""
    renamed_op = rename(node.op)
    if renamed_op != node.op:
        node.op = renamed_op
    for key, value in node.attr.items():
        if key == GRADIENT_OP_TYPE and value.WhichOneof("value") == "s":
            value.s = rename_op_type(value.s.decode()).encode()
        else:
            _rename_attr(value, rename)


def _rename_attr(value: AttrValue, rename: Rename) -> None:
    kind = value.WhichOneof("value")
    if kind == "func":
        value.func.name = rename(value.func.name)
        for nested in value.func.attr.values():
            _rename_attr(nested, rename)
    elif kind == "list":
        for func in value.list.func:
            func.name = rename(func.name)
            for nested in func.attr.values():
                _rename_attr(nested, rename)


def _apply(meta_graph: MetaGraphDef, rename: Rename, rename_op_type: Rename) -> None:
    """Rewrite every place a SavedModel names a function; sort what TF may order by name."""
    graph_def = meta_graph.graph_def
    library = graph_def.library
    kept: dict[str, FunctionDef] = {}
    for fdef in library.function:
        rename_all(fdef, rename, rename_op_type)
        fdef.signature.name = rename(fdef.signature.name)
        kept.setdefault(fdef.signature.name, fdef)  # identical twins collapse into one
    functions = [FunctionDef.FromString(kept[name].SerializeToString()) for name in sorted(kept)]
    del library.function[:]
    library.function.extend(functions)
    for node in graph_def.node:
        rename_node(node, rename, rename_op_type)
    gradients = {(rename(g.function_name), rename(g.gradient_func)) for g in library.gradient}
    del library.gradient[:]
    for function_name, gradient_func in sorted(gradients):
        library.gradient.add(function_name=function_name, gradient_func=gradient_func)
    registered = {(rename(g.gradient_func), rename_op_type(g.registered_op_type)) for g in library.registered_gradients}
    del library.registered_gradients[:]
    for gradient_func, op_type in sorted(registered):
        library.registered_gradients.add(gradient_func=gradient_func, registered_op_type=op_type)
    aliases = meta_graph.meta_info_def.function_aliases
    # TF aliases every trace of an aliased tf.function, saved or not
    # (tensorflow/python/saved_model/save.py, `_list_all_concrete_functions()`): an alias of
    # a trace the library does not hold names nothing, and keeps its process-numbered name.
    renamed_aliases = {rename(name): alias for name, alias in aliases.items() if rename(name) in kept}
    aliases.clear()
    aliases.update(renamed_aliases)
    _apply_object_graph(meta_graph, rename)


def _apply_object_graph(meta_graph: MetaGraphDef, rename: Rename) -> None:
    graph = meta_graph.object_graph_def
    records = {rename(name): record.SerializeToString() for name, record in graph.concrete_functions.items()}
    graph.ClearField("concrete_functions")
    for name, record in records.items():
        graph.concrete_functions[name].ParseFromString(record)
    for node in graph.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            renamed = [rename(name) for name in node.function.concrete_functions]
            del node.function.concrete_functions[:]
            node.function.concrete_functions.extend(renamed)
        elif kind == "bare_concrete_function":
            node.bare_concrete_function.concrete_function_name = rename(
                node.bare_concrete_function.concrete_function_name
            )
        elif kind == "captured_tensor" and node.captured_tensor.concrete_function:
            node.captured_tensor.concrete_function = rename(node.captured_tensor.concrete_function)


# -- fingerprint.pb -------------------------------------------------------------------------


def write_fingerprint(saved_model_dir: Path) -> None:
    """Recompute fingerprint.pb for an edited pb, as tf.saved_model.save does."""
    directory = Path(saved_model_dir)
    try:
        from tensorflow.python.saved_model.pywrap_saved_model import (
            fingerprinting as fp,
        )

        data = fp.CreateFingerprintDef(str(directory))
    except Exception:  # an older/newer TF without the binding: the fingerprint is optional
        (directory / FINGERPRINT_PB).unlink(missing_ok=True)  # never leave a stale one
        return
    write_atomic(directory / FINGERPRINT_PB, _stable_fingerprint(data))


def make_fingerprint_reproducible(saved_model_dir: Path) -> None:
    """Give fingerprint.pb a uuid derived from the model's content instead of a random one.

    TF writes a fresh random uuid at every save, so two exports of the same model would
    differ by that one field: every content hash downstream would change, builds would
    never be reproducible and lock files would churn. The uuid stays unique per content.
    """
    path = Path(saved_model_dir) / FINGERPRINT_PB
    if path.is_file():
        data = path.read_bytes()
        stable = _stable_fingerprint(data)
        if stable != data:
            write_atomic(path, stable)


def _stable_fingerprint(data: bytes) -> bytes:
    from tensorflow.core.protobuf import fingerprint_pb2

    fingerprint = fingerprint_pb2.FingerprintDef.FromString(data)
    if not hasattr(fingerprint, "uuid"):
        return data
    fingerprint.uuid = ""
    digest = hashlib.blake2b(fingerprint.SerializeToString(deterministic=True), digest_size=16).digest()
    fingerprint.uuid = str(int.from_bytes(digest, "big"))
    return fingerprint.SerializeToString(deterministic=True)
