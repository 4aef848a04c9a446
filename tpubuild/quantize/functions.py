"""Quantize named functions one by one, so they keep their identity (alias, concrete name).

TF's quantizer (tensorflow/compiler/mlir/quantization/tensorflow/python/quantize_model.py,
via pywrap_quantize_model.quantize_ptq_static_range / _dynamic_range / _weight_only)
imports each *signature* into MLIR and inlines every function it calls: its output has
one function per signature, so a function placed later by `function_alias` or
`concrete_function_name` would no longer exist. Instead, each kept function F is
quantized as a model of its own and grafted back:

1. **Standalone model.** A copy of the MetaGraphDef gets graph-level nodes: one
   Placeholder per data argument of F and a call of F that passes the variables the
   signature passes down to F (followed through the call chain from the signature's
   graph node to F's call site). Its only SignatureDef, `serving_default`, maps F's
   data arguments to F's outputs; the variables directory is hardlinked.
2. **Calibration (STATIC_RANGE).** The source model runs in a TF1 session on every
   representative sample; the bodies of the functions on each call chain from a
   signature to F are imported into the session's graph (`function_def_to_graph_def`),
   so the data inputs of F's call op can be fetched. Each (sample, call site) pair is one
   calibration sample of the standalone model: F is calibrated on the inputs the
   representative dataset produces where F is called.
3. **Quantize** the standalone model with TF's quantizer (quantize/tf_quantizer.py).
4. **Graft.** The quantized signature is flattened into one function body (its calls are
   inlined), which replaces F's body under F's name. F's resource arguments go (its
   weights are int8 constants now): its call sites and its `bound_inputs` in the object
   graph follow. `function_aliases` still maps F's name to its alias.

Code outside the kept functions stays float32 (its variables stay in the checkpoint); the
float variables only the replaced bodies read are then removed from the captures, the
object graph, the saver and the checkpoint (savedmodel/prune.py), so the artifact serves
the int8 weights alone.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

from tpubuild.errors import ConversionError
from tpubuild.quantize import tf_quantizer as quantization
from tpubuild.savedmodel.checkpoint import write_without
from tpubuild.savedmodel.fnedit import (
    ANY_CALL_OPS,
    CALL_OPS,
    arg_shape,
    control_inputs,
    data_inputs,
    fill_default_attrs,
)
from tpubuild.savedmodel.model import GRAPH, SavedModel, attr_functions
from tpubuild.savedmodel.prune import prune
from tpubuild.tpu.functions import resolve_tpu_functions

STANDALONE_KEY = "serving_default"
ARG_PREFIX = "tpubuild_arg_"
CALL_NODE = "tpubuild_call"


@dataclass(frozen=True)
class ChainLink:
    holder: str  # GRAPH or the function whose body holds `node`
    node: NodeDef  # a call node; the last link's node calls the kept function


@dataclass(frozen=True)
class CallChain:
    signature: str
    links: tuple[ChainLink, ...]


# -- finding the kept functions and their call chains --------------------------------------


def kept_functions(model: SavedModel, entries: list[dict[str, Any]]) -> dict[str, str]:
    """Concrete name -> label of each function the recipe places by alias or concrete name."""
    resolved = resolve_tpu_functions(model, entries)  # the tpu stage's names and errors
    named = ("function_alias", "concrete_function_name")
    return {fn.name: fn.label for fn in resolved if fn.how.startswith(named)}


def signature_node(model: SavedModel, key: str) -> NodeDef | None:
    """The graph-level call node that computes signature `key`'s outputs."""
    outputs = model.meta_graph.signature_def[key].outputs
    producers = {t.name.split(":")[0] for t in outputs.values()}
    for node in model.meta_graph.graph_def.node:
        if node.name in producers and node.op in CALL_OPS:
            return node
    return None


def call_chains(model: SavedModel, fn: str, signature_keys: Iterable[str]) -> list[CallChain]:
    """Every chain of call ops from a signature's graph node down to a call of `fn`."""
    chains = []
    for key in signature_keys:
        top = signature_node(model, key)
        if top is None:
            continue
        if _callee(top) == fn:
            chains.append(CallChain(key, (ChainLink(GRAPH, top),)))
            continue
        for links in _chains_below(model, _callee(top), fn, (ChainLink(GRAPH, top),)):
            chains.append(CallChain(key, links))
    return chains


def _chains_below(model: SavedModel, holder: str, fn: str, above: tuple[ChainLink, ...]):
    if holder not in model.functions or any(link.holder == holder for link in above):
        return
    for node in model.functions[holder].node_def:
        if node.op not in CALL_OPS:
            continue
        link = ChainLink(holder, node)
        if _callee(node) == fn:
            yield (*above, link)
        else:
            yield from _chains_below(model, _callee(node), fn, (*above, link))


def _callee(node: NodeDef) -> str:
    return node.attr["f"].func.name


def graph_ref_of_argument(model: SavedModel, chain: CallChain, index: int) -> str:
    """The graph-level tensor that reaches data input `index` of the chain's last call."""
    ref = data_inputs(chain.links[-1].node)[index]
    for level in range(len(chain.links) - 1, 0, -1):
        holder = model.functions[chain.links[level].holder]
        args = [arg.name for arg in holder.signature.input_arg]
        if ref not in args:
            raise ConversionError(
                f"function {_callee(chain.links[-1].node)}: argument {index} is computed inside "
                f"{holder.signature.name} (node {ref.split(':')[0]}), not passed down from the signature; "
                "cannot quantize the function on its own"
            )
        ref = data_inputs(chain.links[level - 1].node)[args.index(ref)]
    return ref


# -- 1. the standalone model ---------------------------------------------------------------


def data_argument_indexes(fdef: FunctionDef) -> list[int]:
    return [i for i, arg in enumerate(fdef.signature.input_arg) if arg.type != types_pb2.DT_RESOURCE]


def standalone_model(model: SavedModel, fn: str, chain: CallChain, dst: Path) -> list[str]:
    """Write the SavedModel whose one signature calls `fn`; returns its input names in order."""
    proto = saved_model_pb2.SavedModel()
    proto.CopyFrom(model.proto)
    meta_graph = next(mg for mg in proto.meta_graphs if mg.meta_info_def.tags == model.meta_graph.meta_info_def.tags)
    fdef = model.functions[fn]
    graph = meta_graph.graph_def
    call = NodeDef(name=CALL_NODE, op="StatefulPartitionedCall")
    signature = meta_graph.signature_def
    signature.clear()
    sig = signature[STANDALONE_KEY]
    sig.method_name = "tensorflow/serving/predict"
    names = []
    for index, arg in enumerate(fdef.signature.input_arg):
        if arg.type == types_pb2.DT_RESOURCE:
            call.input.append(graph_ref_of_argument(model, chain, index))
            continue
        placeholder = graph.node.add(name=f"{ARG_PREFIX}{index}", op="Placeholder")
        placeholder.attr["dtype"].type = arg.type
        shape = arg_shape(fdef, index)
        if shape is not None:
            placeholder.attr["shape"].shape.CopyFrom(shape)
        call.input.append(placeholder.name)
        sig.inputs[arg.name].name = f"{placeholder.name}:0"
        sig.inputs[arg.name].dtype = arg.type
        if shape is not None:
            sig.inputs[arg.name].tensor_shape.CopyFrom(shape)
        names.append(arg.name)
    call.attr["f"].func.name = fn
    call.attr["Tin"].list.type.extend(arg.type for arg in fdef.signature.input_arg)
    call.attr["Tout"].list.type.extend(arg.type for arg in fdef.signature.output_arg)
    fill_default_attrs(call)
    graph.node.append(call)
    for index, arg in enumerate(fdef.signature.output_arg):
        sig.outputs[f"output_{index}"].name = f"{CALL_NODE}:{index}"
        sig.outputs[f"output_{index}"].dtype = arg.type
    dst.mkdir(parents=True, exist_ok=True)
    SavedModel(model.path, proto, meta_graph).save(dst)
    return names


# -- 2. calibration samples at the call sites ----------------------------------------------


def call_site_samples(
    src: Path, tags: list[str], model: SavedModel, fn: str, chains: list[CallChain],
    samples: dict[str, list[dict[str, Any]]], names: list[str],
) -> list[dict[str, Any]]:
    """Run the source model on each signature's samples; the data inputs of each call of `fn`."""
    import tensorflow as tf

    data_indexes = data_argument_indexes(model.functions[fn])
    captured: list[dict[str, Any]] = []
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        tf.compat.v1.saved_model.loader.load(session, tags, str(src))
        for chain in chains:
            if chain.signature not in samples:
                continue
            inputs = _chain_inputs(graph, model, chain)
            fetches = [inputs[i] for i in data_indexes]
            feeds = model.meta_graph.signature_def[chain.signature].inputs
            for sample in samples[chain.signature]:
                feed = {graph.get_tensor_by_name(feeds[name].name): value for name, value in sample.items()}
                values = session.run(fetches, feed)
                captured.append(dict(zip(names, values)))
    return captured


def _chain_inputs(graph: Any, model: SavedModel, chain: CallChain) -> list[Any]:
    """Tensors of the session graph feeding each input of the chain's last call node.

    Each function body on the chain is imported with its arguments mapped to the tensors
    its caller passes; `function_def_to_graph_def` (tensorflow/python/framework/
    function_def_to_graph.py) names each argument's placeholder after the argument and
    maps FunctionDef references (`node:out:i`) to graph tensor names.
    """
    import tensorflow as tf
    from tensorflow.python.framework.function_def_to_graph import (
        function_def_to_graph_def,
    )

    tensors = [graph.get_tensor_by_name(_graph_tensor(ref)) for ref in data_inputs(chain.links[0].node)]
    for link in chain.links[1:]:
        fdef = model.functions[link.holder]
        graph_def, flat = function_def_to_graph_def(fdef)
        args = {arg.name: tensors[i] for i, arg in enumerate(fdef.signature.input_arg)}
        refs = data_inputs(link.node)
        inner = [ref for ref in refs if ref not in args]
        imported = tf.graph_util.import_graph_def(
            graph_def, input_map={f"{name}:0": t for name, t in args.items()},
            return_elements=[flat[ref] for ref in inner], name=f"tpubuild_chain_{link.holder}",
        ) if inner else []
        found = dict(zip(inner, imported))
        tensors = [args[ref] if ref in args else found[ref] for ref in refs]
    return tensors


def _graph_tensor(ref: str) -> str:
    return ref if ":" in ref else f"{ref}:0"


# -- 4. grafting the quantized body --------------------------------------------------------


def flatten_signature(quantized: saved_model_pb2.SavedModel, tags: list[str], arg_names: list[str]) -> FunctionDef:
    """The quantized `serving_default` as one FunctionDef body with every call inlined.

    Its arguments are named `arg_names` (the kept function's data arguments, in order)
    and its outputs are `output_<i>`. Functions the body still names other than through
    a call op (e.g. If branches) are found by `referenced_library`.
    """
    meta_graph = _meta_graph(quantized, tags)
    sig = meta_graph.signature_def[STANDALONE_KEY]
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    by_input = {sig.inputs[name].name.split(":")[0]: name for name in arg_names}
    body = FunctionDef()
    for name in arg_names:
        arg = body.signature.input_arg.add(name=name)
        arg.type = sig.inputs[name].dtype
    # Graph-level nodes the outputs need, converted to FunctionDef references.
    needed = _upstream(nodes, [t.name for t in sig.outputs.values()])
    for name in sorted(needed):
        if name in by_input:
            continue
        node = body.node_def.add()
        node.CopyFrom(nodes[name])
        node.input[:] = [_function_ref(nodes, ref, by_input) for ref in node.input]
    for index in range(len(sig.outputs)):
        info = sig.outputs[f"output_{index}"]
        out = body.signature.output_arg.add(name=f"output_{index}")
        out.type = info.dtype
        body.ret[out.name] = _function_ref(nodes, info.name, by_input)
    inline_calls(body, library)
    return body


def _meta_graph(proto: saved_model_pb2.SavedModel, tags: list[str]):
    for meta_graph in proto.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return meta_graph
    return proto.meta_graphs[0]


def _upstream(nodes: dict[str, NodeDef], refs: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = [ref.lstrip("^").split(":")[0] for ref in refs]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(ref.lstrip("^").split(":")[0] for ref in nodes[name].input)
    return seen


def _function_ref(nodes: dict[str, NodeDef], ref: str, args: dict[str, str]) -> str:
    """A graph reference (`node`, `node:i`, `^node`) as a FunctionDef reference."""
    if ref.startswith("^"):
        name = ref[1:]
        return f"^{args.get(name, name)}"
    name, _, index = ref.partition(":")
    if name in args:
        return args[name]
    return output_ref(nodes[name], int(index or 0))


def output_ref(node: NodeDef, flat_index: int) -> str:
    """`node:<output arg>:<i>` for flat output `flat_index`, from the op's registered OpDef."""
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        raise ConversionError(f"quantized function: op {node.op} of node {node.name} is not registered")
    start = 0
    for arg in op_def.output_arg:
        if arg.number_attr:
            length = node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            length = len(node.attr[arg.type_list_attr].list.type)
        else:
            length = 1
        if flat_index < start + length:
            return f"{node.name}:{arg.name}:{flat_index - start}"
        start += length
    raise ConversionError(f"quantized function: node {node.name} ({node.op}) has no output {flat_index}")


def inline_calls(body: FunctionDef, library: dict[str, FunctionDef]) -> None:
    """Replace every call op in `body` that calls a function of `library` by its callee's nodes."""
    while True:
        call = next((n for n in body.node_def if n.op in CALL_OPS and _callee(n) in library), None)
        if call is None:
            return
        _inline_one(body, call, library[_callee(call)])


def _inline_one(body: FunctionDef, call: NodeDef, callee: FunctionDef) -> None:
    prefix = f"{call.name}/"
    inputs = data_inputs(call)
    args = {arg.name: inputs[i] for i, arg in enumerate(callee.signature.input_arg)}
    guards = control_inputs(call)

    def rename(ref: str) -> str:
        if ref.startswith("^"):
            name = ref[1:]
            return "^" + (args[name].split(":")[0] if name in args else prefix + name)
        return args[ref] if ref in args else prefix + ref

    copied = []
    for node in callee.node_def:
        new = NodeDef()
        new.CopyFrom(node)
        new.name = prefix + node.name
        new.input[:] = [rename(ref) for ref in data_inputs(node)] + [
            rename(ref) for ref in control_inputs(node)
        ] + guards
        copied.append(new)
    outputs = {
        f"{call.name}:output:{i}": rename(callee.ret[arg.name]) for i, arg in enumerate(callee.signature.output_arg)
    }
    # `^call` keeps meaning "after the callee's side effects": a NoOp under the call's name.
    done = NodeDef(name=call.name, op="NoOp")
    done.input.extend(sorted({f"^{prefix}{name}" for name in callee.control_ret.values()}) + guards)
    kept = [n for n in body.node_def if n.name != call.name]
    del body.node_def[:]
    body.node_def.extend([*kept, *copied, done])
    for node in body.node_def:
        node.input[:] = [outputs.get(ref, ref) for ref in node.input]
    for key, ref in list(body.ret.items()):
        body.ret[key] = outputs.get(ref, ref)


def graft(model: SavedModel, fn: str, body: FunctionDef, library: Iterable[FunctionDef]) -> None:
    """Give `fn` the quantized `body` (data arguments only) and drop its resource arguments."""
    old = FunctionDef()
    old.CopyFrom(model.functions[fn])
    keep = data_argument_indexes(old)
    _check_outputs(old, body)
    new = FunctionDef()
    new.signature.name = fn
    new.signature.input_arg.extend(old.signature.input_arg[i] for i in keep)
    new.signature.output_arg.extend(old.signature.output_arg)
    new.signature.is_stateful = False
    for key, value in old.attr.items():
        new.attr[key].CopyFrom(value)
    for new_index, old_index in enumerate(keep):
        if old_index in old.arg_attr:
            new.arg_attr[new_index].CopyFrom(old.arg_attr[old_index])
    renamed = {a.name: b.name for a, b in zip(body.signature.input_arg, new.signature.input_arg)}
    for node in body.node_def:
        copy = new.node_def.add()
        copy.CopyFrom(node)
        copy.input[:] = [_rename_arg(ref, renamed) for ref in node.input]
    for index, arg in enumerate(new.signature.output_arg):
        new.ret[arg.name] = _rename_arg(body.ret[body.signature.output_arg[index].name], renamed)
    model.functions[fn].CopyFrom(new)
    for fdef in library:
        present = model.functions.get(fdef.signature.name)
        if present is None:
            model.add_function(fdef)
        elif present != fdef:
            raise ConversionError(
                f"function {fn}: its quantized body calls {fdef.signature.name}, a different function "
                "of the same name exists in the model"
            )
    _drop_call_inputs(model, fn, old, keep)
    _drop_bound_inputs(model, fn, old, keep)
    model.invalidate()


def _check_outputs(old: FunctionDef, body: FunctionDef) -> None:
    want = [arg.type for arg in old.signature.output_arg]
    got = [arg.type for arg in body.signature.output_arg]
    if want != got:
        raise ConversionError(
            f"function {old.signature.name}: the quantized function returns {got}, the original {want}"
        )


def _rename_arg(ref: str, renamed: dict[str, str]) -> str:
    if ref.startswith("^"):
        return "^" + renamed.get(ref[1:], ref[1:])
    return renamed.get(ref, ref)


def _drop_call_inputs(model: SavedModel, fn: str, old: FunctionDef, keep: list[int]) -> None:
    """Call sites of `fn` pass only the kept (data) arguments."""
    sites = [node for _, node in model.call_sites(fn)] + model.graph_call_sites(fn)
    for node in sites:
        if node.op not in ANY_CALL_OPS:
            raise ConversionError(f"function {fn}: node {node.name} ({node.op}) refers to it but is not a call")
        data, control = data_inputs(node), control_inputs(node)
        node.input[:] = [data[i] for i in keep] + data[len(old.signature.input_arg):] + control
        types = list(node.attr["Tin"].list.type)
        del node.attr["Tin"].list.type[:]
        node.attr["Tin"].list.type.extend(types[i] for i in keep)
        if "_read_only_resource_inputs" in node.attr:
            # Indexes of resource inputs; none of the kept inputs is a resource.
            del node.attr["_read_only_resource_inputs"].list.i[:]


def _drop_bound_inputs(model: SavedModel, fn: str, old: FunctionDef, keep: list[int]) -> None:
    """The object graph's captures of `fn` are its trailing arguments; drop the removed ones."""
    functions = model.meta_graph.object_graph_def.concrete_functions
    if fn not in functions:
        return
    bound = list(functions[fn].bound_inputs)
    first_capture = len(old.signature.input_arg) - len(bound)
    dropped = [i for i in range(len(old.signature.input_arg)) if i not in keep]
    if any(i < first_capture for i in dropped):
        raise ConversionError(
            f"function {fn}: takes a resource argument from its caller (not a captured variable); "
            "cannot quantize it on its own"
        )
    del functions[fn].bound_inputs[:]
    functions[fn].bound_inputs.extend(bound[i - first_capture] for i in range(first_capture, len(old.signature.input_arg)) if i in keep)


def referenced_library(body: FunctionDef, quantized: saved_model_pb2.SavedModel, tags: list[str]) -> list[FunctionDef]:
    """Functions of the quantized model that `body` still names (closure), e.g. If branches."""
    library = {f.signature.name: f for f in _meta_graph(quantized, tags).graph_def.library.function}
    wanted: list[str] = []
    stack = [name for node in body.node_def for value in node.attr.values() for name in attr_functions(value)]
    while stack:
        name = stack.pop()
        if name in wanted or name not in library:
            continue
        wanted.append(name)
        stack.extend(
            n for node in library[name].node_def for value in node.attr.values() for n in attr_functions(value)
        )
    return [library[name] for name in sorted(wanted)]


# -- the whole procedure -------------------------------------------------------------------


def absorbed(model: SavedModel, functions: dict[str, str]) -> list[tuple[str, str]]:
    """(caller label, callee label) for kept functions that call other kept functions."""
    return sorted(
        (functions[caller], functions[callee])
        for caller in functions for callee in functions
        if callee != caller and callee in model.reachable(caller)
    )


def quantize_functions(
    src: Path, dst: Path, tags: list[str], functions: dict[str, str], method: str, op_set: str,
    samples: dict[str, list[dict[str, Any]]], unit_specs: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Quantize each function of `functions` (name -> label) on its own; write the model to `dst`.

    `samples` are the representative samples by signature key (STATIC_RANGE only);
    `unit_specs` the layers kept in float (the standalone model keeps the body's node names).
    Returns the quantizer's summary per function label, and the names of the float
    variables removed because only the replaced bodies read them.
    """
    # Every function is cut out of the untouched source: the quantizer never sees another
    # function's int8 body (a kept function calling another absorbs its float body).
    source = SavedModel.load(src, tags)
    model = SavedModel.load(src, tags)
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="tpubuild-quantize-functions-") as scratch:
        for index, (fn, label) in enumerate(sorted(functions.items(), key=lambda item: item[1])):
            quantized, names, summary = _quantize_one(
                source, fn, label, Path(scratch) / str(index), method, op_set, samples, unit_specs
            )
            body = flatten_signature(quantized, tags, names)
            graft(model, fn, body, referenced_library(body, quantized, tags))
            summaries[label] = summary
    # The float variables the grafted bodies no longer read go (savedmodel/prune.py).
    removed, object_graph, keys = prune(model)
    dst.mkdir(parents=True, exist_ok=True)
    model.save(dst)
    if object_graph is not None:
        write_without(src, dst, keys, object_graph)
    return summaries, removed


def _quantize_one(
    source: SavedModel, fn: str, label: str, where: Path, method: str, op_set: str,
    samples: dict[str, list[dict[str, Any]]], unit_specs: list[dict[str, Any]] | None = None,
) -> tuple[saved_model_pb2.SavedModel, list[str], dict[str, Any]]:
    """Steps 1-3 for one function: its quantized standalone model, input names, summary."""
    from tpubuild.quantize.datasets import write_tfrecord

    tags = list(source.meta_graph.meta_info_def.tags)
    chains = call_chains(source, fn, source.meta_graph.signature_def.keys())
    if not chains:
        raise ConversionError(
            f"function {source.describe(fn)} is not called through a call op from any signature; "
            "cannot quantize it on its own"
        )
    names = standalone_model(source, fn, chains[0], where / "standalone")
    datasets, captured = {}, []
    if method == "STATIC_RANGE":
        captured = call_site_samples(source.path, tags, source, fn, chains, samples, names)
        # The calibration session is closed; what it held goes back before the quantizer,
        # which peaks at several times the model (ResNet50: ~3.7 GB) on top of it.
        from tpubuild.memory import release_memory

        release_memory()
        if not captured:
            raise ConversionError(
                f"function {source.describe(fn)}: no representative sample reaches it "
                f"(signatures with datasets: {', '.join(sorted(samples)) or 'none'})"
            )
        datasets[STANDALONE_KEY] = where / "calibration.tfrecord"
        write_tfrecord(datasets[STANDALONE_KEY], STANDALONE_KEY, captured)
    options = quantization.build_options(method, tags, [STANDALONE_KEY], op_set, datasets, unit_specs)
    try:
        log = quantization.run_quantizer(where / "standalone", where / "quantized", options)
    except quantization.QuantizerFailed as exc:
        raise quantization.QuantizerFailed(f"function {label}: {exc.line}", exc.log) from None
    quantized = saved_model_pb2.SavedModel.FromString((where / "quantized" / "saved_model.pb").read_bytes())
    return quantized, names, {**quantization.parse_summary(log), "calibration_samples": len(captured)}
