"""Grappler at build time: TensorFlow's graph optimizer applied to a SavedModel's functions.

TensorFlow runs Grappler on every function when it instantiates it (at load or first
call, on the serving machine). Running the machine-independent passes here moves that
work to build time and ships the smaller function bodies.

How: `tf_optimizer.OptimizeGraph` (tensorflow/python/grappler/tf_optimizer.py) runs the
meta optimizer on a MetaGraphDef, fetching the signature outputs. The meta optimizer
optimizes the main graph, then each function of the library reachable from it, one
GrapplerFunctionItem per function (tensorflow/core/grappler/optimizers/meta_optimizer.cc,
MetaOptimizer::OptimizeConsumeItem: MakeGrapplerFunctionItem, the passes, MakeFunctionDef,
`flib.ReplaceFunction(func_name, optimized_func)`): a function keeps its name and its
signature, so the object graph and the signature defs that name it stay valid. The TFLite
converter drives Grappler the same way (tensorflow/lite/python/util.py,
run_graph_optimizations). Only the function bodies are taken back; the main graph (what
TF Serving runs: placeholders, the calls, the saver's nodes) is kept as saved.

Passes: the defaults (pruning, constant folding, arithmetic, dependency, loop, shape,
common subgraph elimination, ...) with three changes:
- function_optimization OFF: it inlines and specializes calls into new functions with
  new names; the SavedModel's object graph names the original functions.
- remapper OFF: its fusions depend on the building machine (oneDNN on or off,
  tensorflow/core/grappler/optimizers/remapper.cc IsMKLEnabled) and the serving runtime
  redoes them for its own CPU.
- min_graph_nodes -1: optimize small functions too (the default skips graphs under 4 nodes).
The save and restore functions are left as saved: they run once, and loaders (TF
Serving's restore op) call them by node name from the main graph.
"""

from __future__ import annotations

from typing import Any

from tpubuild.savedmodel.model import SavedModel, node_functions


def optimize_functions(model: SavedModel) -> dict[str, Any]:
    """Optimize the bodies of `model`'s functions in place; returns node counts per function."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.function_optimization = rewriter_config_pb2.RewriterConfig.OFF
    rewrite.remapping = rewriter_config_pb2.RewriterConfig.OFF
    rewrite.min_graph_nodes = -1
    item = meta_graph_pb2.MetaGraphDef()
    item.CopyFrom(model.meta_graph)
    optimized = tf_optimizer.OptimizeGraph(config, item, verbose=False)
    bodies = {f.signature.name: f for f in optimized.library.function}
    kept = _saver_functions(model)
    counts: dict[str, list[int]] = {}
    for fdef in model.meta_graph.graph_def.library.function:
        name = fdef.signature.name
        new = bodies.get(name)
        if name in kept or new is None:
            continue
        if _bare(new.signature) != _bare(fdef.signature) or set(new.control_ret) != set(fdef.control_ret):
            continue  # never expected (MakeFunctionDef keeps the signature): keep the original
        counts[name] = [len(fdef.node_def), len(new.node_def)]
        # The body only: the signature as saved keeps what Grappler's copy drops (each
        # resource argument's handle_data, the dtype and shape of the variable behind it,
        # which tf.saved_model.load uses), and attrs and arg_attrs stay as saved.
        del fdef.node_def[:]
        fdef.node_def.extend(new.node_def)
        fdef.ret.clear()
        fdef.ret.update(new.ret)
        fdef.control_ret.clear()
        fdef.control_ret.update(new.control_ret)
    known = set(model.functions)
    for name, fdef in sorted(bodies.items()):  # functions a pass added (none with the passes above)
        if name not in known:
            model.add_function(fdef)
    model.invalidate()
    return {
        "functions": dict(sorted(counts.items())),
        "nodes": [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())],
    }


def _bare(signature: Any) -> Any:
    """An OpDef without the resource arguments' handle_data (which Grappler's copy drops)."""
    copy = type(signature)()
    copy.CopyFrom(signature)
    for arg in list(copy.input_arg) + list(copy.output_arg):
        arg.ClearField("handle_data")
    return copy


def _saver_functions(model: SavedModel) -> set[str]:
    """The functions the saver's save and restore nodes call (and what they call)."""
    saver = model.meta_graph.saver_def
    nodes = {saver.save_tensor_name.split(":")[0], saver.restore_op_name.split(":")[0]} - {""}
    called: set[str] = set()
    for node in model.meta_graph.graph_def.node:
        if node.name in nodes:
            called |= node_functions(node)
    for name in list(called):
        called |= model.reachable(name)
    return called
