"""make_reproducible: one export script, two processes, the same bytes; the model still works.

The export runs in two subprocesses with different PYTHONHASHSEED, one of which traced
unrelated functions first, so TensorFlow's per-process counters give every function,
capture and custom gradient other numbers (reproducible_export.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reproducible_export
import tensorflow as tf
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SAVED_MODEL_PB, SavedModel, node_functions
from tpubuild.savedmodel.reproducible import canonicalize, make_reproducible

EXPORT_SCRIPT = Path(reproducible_export.__file__)

CANONICAL_NAME = re.compile(r"_\d{10}$")


def _export(out: Path, seed: str, *flags: str) -> Path:
    env = {**os.environ, "PYTHONHASHSEED": seed, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, str(EXPORT_SCRIPT), str(out), *flags], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def reproducible_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Raw exports from a clean process and a warmed-up one, and canonical copies of both."""
    root = tmp_path_factory.mktemp("reproducible")
    raw = {"clean": _export(root / "clean", "1"), "warm": _export(root / "warm", "4242", "--warm-up")}
    found = dict(raw)
    for name, path in raw.items():
        copy = root / f"{name}-canonical"
        shutil.copytree(path, copy)
        make_reproducible(copy)
        found[f"{name}-canonical"] = copy
    return found


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_two_processes_give_byte_identical_saved_models(reproducible_exports: dict[str, Path]) -> None:
    # Without the rewrite the two exports differ (else this test would prove nothing).
    raw = reproducible_exports
    assert (raw["clean"] / SAVED_MODEL_PB).read_bytes() != (raw["warm"] / SAVED_MODEL_PB).read_bytes()
    clean, warm = _files(reproducible_exports["clean-canonical"]), _files(reproducible_exports["warm-canonical"])
    assert sorted(clean) == sorted(warm)
    assert [name for name in clean if clean[name] != warm[name]] == []


def test_is_idempotent(reproducible_exports: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again"
    shutil.copytree(reproducible_exports["clean-canonical"], again)
    make_reproducible(again)
    assert _files(again) == _files(reproducible_exports["clean-canonical"])


def test_every_function_reference_resolves(reproducible_exports: dict[str, Path]) -> None:
    model = SavedModel.load(reproducible_exports["warm-canonical"])
    library = set(model.functions)
    assert all(CANONICAL_NAME.search(name) for name in library), sorted(library)
    referenced = set().union(*(node_functions(node) for node in model.meta_graph.graph_def.node))
    for fdef in model.functions.values():
        referenced |= set().union(set(), *(node_functions(node) for node in fdef.node_def))
    graph = model.meta_graph.object_graph_def
    referenced |= set(graph.concrete_functions)
    for node in graph.nodes:
        referenced |= set(node.function.concrete_functions)
        if node.WhichOneof("kind") == "bare_concrete_function":
            referenced.add(node.bare_concrete_function.concrete_function_name)
    assert referenced <= library, referenced - library
    # The alias, the signature and the registered custom gradient survive the renaming.
    assert list(model.aliases.values()) == ["tpu_func"] and set(model.aliases) <= library
    assert model.signatures["serving_default"] in library
    gradients = model.meta_graph.graph_def.library.registered_gradients
    assert gradients and {g.gradient_func for g in gradients} <= library
    op_types = {g.registered_op_type for g in gradients}
    used = {
        node.attr["_gradient_op_type"].s.decode()
        for fdef in model.functions.values()
        for node in fdef.node_def
        if "_gradient_op_type" in node.attr
    }
    assert used and used <= op_types


def test_the_renamed_model_loads_and_runs_like_the_export(reproducible_exports: dict[str, Path]) -> None:
    x = np.random.default_rng(0).normal(size=(5, reproducible_export.FEATURES)).astype("float32")
    options = tf.saved_model.LoadOptions(experimental_load_function_aliases=True)
    raw = tf.saved_model.load(str(reproducible_exports["clean"]), options=options)
    canonical = tf.saved_model.load(str(reproducible_exports["warm-canonical"]), options=options)
    # The same ops and weights, but never compared bit for bit: the two loads are separate
    # function instantiations, and oneDNN/Grappler may choose kernels or fusions per
    # instantiation and thread count, which can reorder float additions.
    expected = raw.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    got = canonical.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        canonical.function_aliases["tpu_func"](tf.constant(x)).numpy(),
        raw.function_aliases["tpu_func"](tf.constant(x)).numpy(),
        rtol=1e-6,
        atol=1e-6,
    )
    # The custom gradient is still the one used: d sum(tpu_func(x)) / dx = clip(1) * row sums of w.
    inputs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        total = tf.reduce_sum(canonical.tpu_func(inputs))
    weights = canonical.w.numpy()
    clipped = np.tile(reproducible_export.CLIP * weights.sum(axis=1), (len(x), 1))
    np.testing.assert_allclose(tape.gradient(total, inputs).numpy(), clipped, rtol=1e-5, atol=1e-6)


def _calling(name: str, callee: str) -> FunctionDef:
    fdef = FunctionDef()
    fdef.signature.name = name
    node = fdef.node_def.add(name="call", op="PartitionedCall")
    node.attr["f"].func.name = callee
    return fdef


def test_a_call_cycle_is_refused_with_the_functions_named() -> None:
    meta_graph = MetaGraphDef()
    meta_graph.graph_def.library.function.extend([_calling("ping_12", "pong_13"), _calling("pong_13", "ping_12")])
    with pytest.raises(ConversionError, match=r"function ping_12: calls itself \(ping_12 -> pong_13 -> ping_12\)"):
        canonicalize(meta_graph)


def test_identical_functions_share_one_name_and_direct_calls_are_renamed() -> None:
    meta_graph = MetaGraphDef()
    library = meta_graph.graph_def.library
    library.function.extend([_calling("twin_12", "leaf_7"), _calling("twin_34", "leaf_7")])
    leaf = library.function.add()
    leaf.signature.name = "leaf_7"
    caller = _calling("caller_56", "twin_12")
    caller.node_def.add(name="direct", op="twin_34")  # a function called as an op
    library.function.append(caller)
    canonicalize(meta_graph)
    names = [f.signature.name for f in library.function]
    assert len(names) == 3 and all(CANONICAL_NAME.search(name) for name in names), names
    (twin,) = [name for name in names if name.startswith("twin_")]
    (caller,) = [f for f in library.function if f.signature.name.startswith("caller_")]
    assert [caller.node_def[0].attr["f"].func.name, caller.node_def[1].op] == [twin, twin]


def test_an_unsaved_custom_gradient_loses_its_process_uid() -> None:
    meta_graph = MetaGraphDef()
    fdef = _calling("f_3", "f_3_missing")
    fdef.node_def[0].attr["_gradient_op_type"].s = b"CustomGradient-77"  # no registered gradient
    fdef.node_def.add(name="overridden", op="Identity").attr["_gradient_op_type"].s = b"MyGradient"
    meta_graph.graph_def.library.function.append(fdef)
    canonicalize(meta_graph)
    (renamed,) = meta_graph.graph_def.library.function
    assert [n.attr["_gradient_op_type"].s for n in renamed.node_def] == [b"CustomGradient-unsaved", b"MyGradient"]
