"""A SavedModel read as protos (saved_model.pb): functions, aliases, signatures, call graph.

Stages edit `proto` in place and `save()` it next to the (hardlinked) variables; nothing
here executes the model, so reading a large SavedModel stays cheap.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

from tensorflow.core.framework.attr_value_pb2 import AttrValue
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

from tpubuild.atomic import write_atomic
from tpubuild.errors import ConversionError
from tpubuild.savedmodel import proto_limit

# make_fingerprint_reproducible is re-exported: callers imported it from here first.
from tpubuild.savedmodel.reproducible import (  # noqa: F401
    make_fingerprint_reproducible,
    write_fingerprint,
)
from tpubuild.savedmodel.variable_handles import normalize_handles

SAVED_MODEL_PB = "saved_model.pb"
# Written by TF at save time from the pb's bytes; it goes stale once the pb is edited.
FINGERPRINT_PB = "fingerprint.pb"
DEFAULT_TAGS = ["serve"]
# The graph-level caller: nodes of meta_graph.graph_def (what TF Serving runs for a signature).
GRAPH = ""
INIT_OP_KEY = "__saved_model_init_op"


def attr_functions(value: AttrValue) -> Iterator[str]:
    """Names of the functions an attribute value refers to (func, list of funcs, nested)."""
    kind = value.WhichOneof("value")
    if kind == "func":
        yield value.func.name
        for nested in value.func.attr.values():
            yield from attr_functions(nested)
    elif kind == "list":
        for func in value.list.func:
            yield func.name
            for nested in func.attr.values():
                yield from attr_functions(nested)


def node_functions(node: NodeDef) -> set[str]:
    """Functions a node calls through any func-valued attribute (If/While bodies included)."""
    return {name for value in node.attr.values() for name in attr_functions(value)}


class SavedModel:
    """A SavedModel read as protos, editable in place; one MetaGraphDef selected by tags."""

    def __init__(self, path: Path, proto: saved_model_pb2.SavedModel, meta_graph: MetaGraphDef):
        self.path = path
        self.proto = proto
        self.meta_graph = meta_graph
        self._functions: dict[str, FunctionDef] | None = None
        self._callees: dict[str, set[str]] | None = None
        # Duplicate variable handles merged and unused ones removed on load
        # (savedmodel/variable_handles.py).
        self.merged_handles: list = []

    @classmethod
    def load(cls, path: Path, tags: list[str] | None = None) -> "SavedModel":
        """Read `path/saved_model.pb` and select the MetaGraphDef whose tag set equals `tags`."""
        path = Path(path)
        if not path.is_dir():
            raise ConversionError(f"{path}: no such SavedModel directory")
        pb = path / SAVED_MODEL_PB
        if not pb.is_file():
            raise ConversionError(f"{path}: not a SavedModel (no {SAVED_MODEL_PB}){proto_limit.cpb_hint(path)}")
        proto_limit.check_readable(pb)  # protobuf's 2 GiB: one line, not a parse error
        proto = saved_model_pb2.SavedModel()
        try:
            proto.ParseFromString(pb.read_bytes())
        except Exception as exc:  # protobuf raises DecodeError or RuntimeError by version
            raise ConversionError(f"{pb}: cannot parse SavedModel proto: {exc}") from None
        meta_graph = _select(proto, path, tags)
        if not meta_graph.object_graph_def.nodes:
            raise ConversionError(
                f"{path} is a TF1 SavedModel; tpubuild converts TF2 SavedModels only"
            )
        variables = sum(1 for node in meta_graph.object_graph_def.nodes if node.WhichOneof("kind") == "variable")
        if variables and not (path / "variables" / "variables.index").is_file():
            # An input error (a copy that left out variables/), not a tpubuild bug.
            raise ConversionError(
                f"the SavedModel's graph has {variables} variable{'s' if variables != 1 else ''} but it has no "
                "variables/variables.index: was its variables/ directory left out when it was copied?"
            )
        model = cls(path, proto, meta_graph)
        # Every stage sees, and every stage that writes a model writes, one handle per
        # weight: the one its functions read, restored by the checkpoint.
        model.merged_handles = normalize_handles(meta_graph)
        return model

    # -- the function library -------------------------------------------------------------

    @property
    def functions(self) -> dict[str, FunctionDef]:
        """The function library by name; values are live views into the proto."""
        if self._functions is None:
            self._functions = {f.signature.name: f for f in self.meta_graph.graph_def.library.function}
        return self._functions

    def add_function(self, fdef: FunctionDef) -> FunctionDef:
        """Append a copy of `fdef` to the library and return the live copy."""
        if fdef.signature.name in self.functions:
            raise ValueError(f"function {fdef.signature.name} already exists")
        added = self.meta_graph.graph_def.library.function.add()
        added.CopyFrom(fdef)
        self.invalidate()
        return added

    def remove_function(self, name: str) -> None:
        """Delete a function from the library (callers must have been rewritten first)."""
        library = self.meta_graph.graph_def.library.function
        for index, fdef in enumerate(library):
            if fdef.signature.name == name:
                del library[index]
                break
        self.invalidate()

    def invalidate(self) -> None:
        """Forget cached indexes; call after editing nodes or the library directly."""
        self._functions = None
        self._callees = None

    def unique_name(self, base: str) -> str:
        """A function name not yet used in the library, derived from `base`."""
        name, n = base, 0
        while name in self.functions:
            n += 1
            name = f"{base}_{n}"
        return name

    # -- names ----------------------------------------------------------------------------

    @property
    def aliases(self) -> dict[str, str]:
        """Concrete function name -> alias (meta_info_def.function_aliases), a copy."""
        return dict(self.meta_graph.meta_info_def.function_aliases)

    @property
    def signatures(self) -> dict[str, str]:
        """Signature key -> the concrete function the signature calls."""
        found = self._signatures_from_object_graph()
        for key in self.meta_graph.signature_def:
            if key != INIT_OP_KEY and key not in found:
                name = self._signature_from_graph(key)
                if name:
                    found[key] = name
        return found

    def _signatures_from_object_graph(self) -> dict[str, str]:
        nodes = self.meta_graph.object_graph_def.nodes
        if not nodes:
            return {}
        for child in nodes[0].children:
            if child.local_name == "signatures":
                sig_node = nodes[child.node_id]
                break
        else:
            return {}
        found = {}
        for child in sig_node.children:
            target = nodes[child.node_id]
            if target.WhichOneof("kind") == "bare_concrete_function":
                found[child.local_name] = target.bare_concrete_function.concrete_function_name
            elif target.WhichOneof("kind") == "function" and target.function.concrete_functions:
                found[child.local_name] = target.function.concrete_functions[0]
        return found

    def _signature_from_graph(self, key: str) -> str | None:
        """The function called by the graph node that produces the signature's outputs."""
        outputs = self.meta_graph.signature_def[key].outputs
        producers = {t.name.split(":")[0] for t in outputs.values()}
        for node in self.meta_graph.graph_def.node:
            if node.name in producers and "f" in node.attr:
                return node.attr["f"].func.name
        return None

    def alias_of(self, fn: str) -> str | None:
        return self.meta_graph.meta_info_def.function_aliases.get(fn)

    def describe(self, fn: str) -> str:
        """How messages name a function: `"alias" (alias of NAME)` or `"NAME"`."""
        alias = self.alias_of(fn)
        return f'"{alias}" (alias of {fn})' if alias else f'"{fn}"'

    # -- the call graph -------------------------------------------------------------------

    def _callee_index(self) -> dict[str, set[str]]:
        if self._callees is None:
            index: dict[str, set[str]] = {GRAPH: set()}
            for node in self.meta_graph.graph_def.node:
                index[GRAPH] |= node_functions(node)
            for name, fdef in self.functions.items():
                index[name] = set()
                for node in fdef.node_def:
                    index[name] |= node_functions(node)
                # A function's own attrs can name functions too (e.g. gradients).
                for value in fdef.attr.values():
                    index[name] |= set(attr_functions(value))
            self._callees = index
        return self._callees

    def callees(self, fn: str) -> set[str]:
        """Functions `fn` calls directly through any func-valued attribute of its nodes."""
        return set(self._callee_index().get(fn, set()))

    def callers(self, fn: str) -> set[str]:
        """Library functions that call `fn` directly (graph-level nodes are not included)."""
        return {name for name, called in self._callee_index().items() if name and fn in called}

    def reachable(self, fn: str) -> set[str]:
        """Every function `fn` calls, directly or transitively (not `fn` itself unless recursive)."""
        seen: set[str] = set()
        stack = list(self.callees(fn))
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(self.callees(name))
        return seen

    def call_sites(self, fn: str) -> list[tuple[str, NodeDef]]:
        """(caller function name, node) for each node of a library function that calls `fn`."""
        sites = []
        for caller in sorted(self.callers(fn)):
            for node in self.functions[caller].node_def:
                if fn in node_functions(node):
                    sites.append((caller, node))
        return sites

    def graph_call_sites(self, fn: str) -> list[NodeDef]:
        """Nodes of the top-level graph (signature_def / save / restore) that call `fn`."""
        return [node for node in self.meta_graph.graph_def.node if fn in node_functions(node)]

    # -- writing --------------------------------------------------------------------------

    def save(self, output_dir: Path) -> None:
        """Write saved_model.pb into the empty `output_dir`; link or copy the other files."""
        output_dir = Path(output_dir)
        if any(output_dir.iterdir()):
            raise ValueError(f"{output_dir} is not empty")
        prepare_for_older_runtimes(self.meta_graph)
        data = proto_limit.serialize(self.proto, output_dir)  # over protobuf's 2 GiB: one line, nothing written
        for entry in sorted(self.path.iterdir()):
            if entry.name in (SAVED_MODEL_PB, "saved_model.pbtxt", FINGERPRINT_PB):
                continue
            _link_tree(entry, output_dir / entry.name)
        write_atomic(output_dir / SAVED_MODEL_PB, data)
        write_fingerprint(output_dir)


def prepare_for_older_runtimes(meta_graph: MetaGraphDef) -> None:
    """Strip default-valued attributes and list the ops used, as TensorFlow's saver does.

    A TensorFlow older than an attribute does not know it: it logs "NodeDef mentions
    attribute ... Unknown attributes will be ignored" for the node and drops it
    (ValidateNodeDef, tensorflow/core/framework/node_def_util.cc). Spelling out defaults
    (BatchFunction's `batch_padding_policy`, ...) only makes such logs and raises the
    oldest release that understands the model (tpubuild.report.compat). TF's own
    stripper does the work: tensorflow/python/framework/meta_graph.py
    `strip_graph_default_valued_attrs` (graph nodes and every library function's nodes,
    nodes calling a library function left alone; the C++ twin is `StripDefaultAttributes`
    in tensorflow/core/framework/graph_def_util.cc); it sets
    `meta_info_def.stripped_default_attrs`, and loaders fill defaults from their registry.
    tf.saved_model.save does both (tensorflow/python/saved_model/save.py,
    `_fill_meta_graph_def`), but stages add nodes with every default filled in, and ops
    (BatchFunction, TPU ops) the exporter never listed, so each write does it again, with
    the same functions: a model no stage changed is written back byte for byte.
    """
    from tensorflow.python.framework import meta_graph as tf_meta_graph

    tf_meta_graph.strip_graph_default_valued_attrs(meta_graph)
    meta_graph.meta_info_def.stripped_op_list.CopyFrom(
        tf_meta_graph.stripped_op_list_for_graph(meta_graph.graph_def)
    )


def _select(proto: saved_model_pb2.SavedModel, path: Path, tags: list[str] | None) -> MetaGraphDef:
    available = [sorted(mg.meta_info_def.tags) for mg in proto.meta_graphs]
    if tags is None and len(proto.meta_graphs) == 1:
        return proto.meta_graphs[0]
    wanted = set(tags if tags is not None else DEFAULT_TAGS)
    for mg in proto.meta_graphs:
        if set(mg.meta_info_def.tags) == wanted:
            return mg
    listed = ", ".join("[" + ", ".join(t) + "]" for t in available) or "none"
    raise ConversionError(
        f"{path}: no MetaGraphDef with tags [{', '.join(sorted(wanted))}]; tag sets: {listed}"
    )


def _link_tree(src: Path, dst: Path) -> None:
    """Hardlink files (cheap, variables can be GBs); copy where linking is not possible."""
    if src.is_dir():
        dst.mkdir()
        for entry in sorted(src.iterdir()):
            _link_tree(entry, dst / entry.name)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def readable_copy(saved_model_dir: Path, tags: list[str], scratch: Path) -> Path:
    """The SavedModel a session-based TF tool (quantizer, LiteRT converter, AOT freezer)
    should read: `saved_model_dir` itself when it has one handle per weight, else a copy
    in `scratch` (a new, empty directory is made there) with the duplicates merged.
    `SavedModel.load` merges them too, so every stage that writes a model writes it merged."""
    model = SavedModel.load(Path(saved_model_dir), tags)
    if not model.merged_handles:
        return Path(saved_model_dir)
    copy = Path(scratch) / "one-handle-per-weight"
    copy.mkdir(parents=True)
    model.save(copy)
    return copy
