"""HLO text of functions, via `experimental_get_compiler_ir`, for reviewers of TPU functions.

The function is found in the loaded SavedModel through the object graph (its attribute
path from the root), wrapped in a `jit_compile=True` tf.function, and lowered with
unknown dimensions set to 1 (batch size one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel

# XLA names the module after the traced wrapper, `__inference_wrapper_<uid>` mangled to
# `a_inference_wrapper_<uid>__`; the uid is a per-process counter (ops.uid() in
# tensorflow/python/framework/ops.py), so without this the same function's HLO text would
# differ between builds.
_WRAPPER_UID = re.compile(r"(_inference_wrapper)_\d+__")


def object_paths(model: SavedModel) -> dict[str, list[str]]:
    """Concrete function name -> attribute path from the root object that holds it."""
    nodes = model.meta_graph.object_graph_def.nodes
    paths: dict[int, list[str]] = {0: []}
    queue = [0]
    while queue:
        node_id = queue.pop(0)
        for child in nodes[node_id].children:
            if child.node_id not in paths:
                paths[child.node_id] = paths[node_id] + [child.local_name]
                queue.append(child.node_id)
    found: dict[str, list[str]] = {}
    for node_id, path in sorted(paths.items(), key=lambda kv: len(kv[1])):
        node = nodes[node_id]
        if node.WhichOneof("kind") == "function" and "signatures" not in path:
            for name in node.function.concrete_functions:
                found.setdefault(name, path)
    return found


def _batch_one(spec: Any) -> Any:
    if isinstance(spec, tf.TensorSpec):
        shape = [1 if d is None else d for d in spec.shape.as_list()] if spec.shape.rank is not None else [1]
        return tf.TensorSpec(shape, spec.dtype)
    return spec


def function_hlo(path: Path, tags: list[str], names: list[str], loaded: Any = None) -> dict[str, dict[str, str]]:
    """{name: {"hlo": text} or {"error": one line}} for each concrete function name;
    `loaded`: the SavedModel at `path` already loaded with tf.saved_model.load."""
    model = SavedModel.load(path, tags)
    paths = object_paths(model)
    if loaded is None:
        loaded = tf.saved_model.load(str(path), tags=tags)
    results: dict[str, dict[str, str]] = {}
    for name in names:
        if name not in paths:
            results[name] = {"error": "not reachable from the object graph; no HLO"}
            continue
        target = loaded
        for attr in paths[name]:
            target = getattr(target, attr)
        try:
            concrete = target.concrete_functions[0] if hasattr(target, "concrete_functions") else None
            args, kwargs = (concrete or target._list_all_concrete_functions()[0]).structured_input_signature
            args = tf.nest.map_structure(_batch_one, args)
            kwargs = tf.nest.map_structure(_batch_one, kwargs)
            wrapper = tf.function(tf.autograph.experimental.do_not_convert(target), jit_compile=True)
            text = wrapper.experimental_get_compiler_ir(*args, **kwargs)(stage="hlo")
            results[name] = {"hlo": _WRAPPER_UID.sub(r"\1__", text)}
        except Exception as exc:  # XLA refuses the function: the reason is the finding
            text = (getattr(exc, "message", None) or str(exc)).strip().splitlines()
            results[name] = {"error": f"{type(exc).__name__}: {text[0] if text else ''}"}
    return results
