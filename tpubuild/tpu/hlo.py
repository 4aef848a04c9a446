"""HLO text of functions, via `experimental_get_compiler_ir`, for reviewers of TPU functions.

The function is found in the loaded SavedModel through the object graph (its attribute
path from the root: a saved tf.function, or a body the CPU twin exposes with its
variables bound, tpu/captures.py), wrapped in a `jit_compile=True` tf.function, and
lowered with unknown dimensions set to 1 (batch size one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.types.experimental import ConcreteFunction

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.captures import bound_inputs, object_paths

# XLA names the module after the traced wrapper, `__inference_wrapper_<uid>` mangled to
# `a_inference_wrapper_<uid>__`; the uid is a per-process counter (ops.uid() in
# tensorflow/python/framework/ops.py), so without this the same function's HLO text would
# differ between builds.
_WRAPPER_UID = re.compile(r"(_inference_wrapper)_\d+__")


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
            why = bound_inputs(model, name) if name in model.functions else "not in the function library"
            why = why if isinstance(why, str) else "not reachable from the object graph"
            results[name] = {"error": f"{why}; no HLO"}
            continue
        target = loaded
        for attr in paths[name]:
            target = getattr(target, attr)
        try:
            if isinstance(target, ConcreteFunction):  # a bare concrete function
                concrete = target
            elif hasattr(target, "concrete_functions"):
                concrete = target.concrete_functions[0]
            else:
                concrete = target._list_all_concrete_functions()[0]
            args, kwargs = concrete.structured_input_signature
            args = tf.nest.map_structure(_batch_one, args)
            kwargs = tf.nest.map_structure(_batch_one, kwargs)
            wrapper = tf.function(tf.autograph.experimental.do_not_convert(target), jit_compile=True)
            text = wrapper.experimental_get_compiler_ir(*args, **kwargs)(stage="hlo")
            results[name] = {"hlo": _WRAPPER_UID.sub(r"\1__", text)}
        except Exception as exc:  # XLA refuses the function: the reason is the finding
            text = (getattr(exc, "message", None) or str(exc)).strip().splitlines()
            results[name] = {"error": f"{type(exc).__name__}: {text[0] if text else ''}"}
    return results
