"""Load an artifact the way TF Serving does: a v1 Session, the saver's restore op, the init op.

TF Serving's `SavedModelBundle` (tensorflow/cc/saved_model/loader.cc: LoadSavedModel ->
LoadMetaGraphIntoSession, RunRestore, RunInitOp) imports the MetaGraphDef's graph into a
session, runs the saver's restore op on `variables/variables` and then the init op.
`tf.compat.v1.saved_model.loader.load` is the Python twin of that path
(tensorflow/python/saved_model/loader_impl.py: SavedModelLoader.load -> restore_variables,
run_init_ops). TF2's `tf.saved_model.load` takes another route (the object graph, one
variable per node, captures bound by node id), so an artifact it loads can still be one
TF Serving rejects: a restore that assigns a bfloat16 tensor to a float variable, or a
function reading a handle the checkpoint never restores.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpubuild.errors import ConversionError
from tpubuild.telling import telling_line

_NODE = re.compile(r"\{\{node ([^}]+)\}\}|node (\S+?)(?: |\}|$)")


def check_serving_load(saved_model_dir: Path, tags: list[str], what: str) -> None:
    """Load `saved_model_dir` with the session-based loader and restore its variables;
    a failure is a ConversionError naming the node TF names."""
    import tensorflow as tf
    from tensorflow.python.saved_model.loader_impl import SavedModelLoader

    graph = tf.Graph()
    try:
        with tf.compat.v1.Session(graph=graph, config=_unoptimized()) as session, graph.as_default():
            # tf.compat.v1.saved_model.loader.load's own steps (SavedModelLoader.load:
            # load_graph, restore_variables, run_init_ops), with the checks of the variables
            # added to the graph before its first run: a session sends its graph to the
            # runtime again, function library and all, at the first run after the graph
            # grew (BaseSession._extend_graph; BERT-base's artifact: ~0.1 s of CPU), and
            # saved_model.pb is parsed once instead of twice.
            loader = SavedModelLoader(str(saved_model_dir))
            saver, _ = loader.load_graph(graph, list(tags))
            names, checks = _initialized_checks(graph, loader.get_meta_graph_def_from_tags(list(tags)))
            loader.restore_variables(session, saver)
            loader.run_init_ops(session, list(tags))
            unrestored = [name for name, ok in zip(names, session.run(checks) if checks else []) if not ok]
    except (tf.errors.OpError, OSError, ValueError, RuntimeError) as exc:
        raise ConversionError(f"{what} does not load in TF Serving's session-based loader: {_telling(exc)}") from None
    finally:
        from tpubuild.memory import release_memory

        del graph  # the session is closed: its buffers go with the graph (no cycles to collect)
        release_memory(collect=False)
    if unrestored:
        more = f" and {len(unrestored) - 1} more" if len(unrestored) > 1 else ""
        raise ConversionError(
            f"{what} loads in TF Serving's session-based loader with variable {unrestored[0]!r}{more} "
            "never restored: the checkpoint restores another handle than the one the graph reads"
        )


def _unoptimized():  # type: ignore[no-untyped-def]
    """A session without Grappler. Its first run (the restore) otherwise optimizes the
    graph it prunes to before running it, about half the check's CPU (ResNet50 bf16's
    artifact: 1.2 s of CPU with it, 0.65 s without) for a graph run once. Grappler
    cannot change what this checks: its rewrites are kept only when they succeed (a
    failed optimizer is logged and its input graph used), and the restore's and the init
    op's kernels, the dtypes they assign and the handles they write, are the same either way."""
    from tensorflow.core.protobuf import config_pb2

    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def _initialized_checks(graph, meta_graph) -> tuple[list[str], list]:  # type: ignore[no-untyped-def]
    """The top-level graph's variables and an op per variable saying whether it is
    initialized: one still uninitialized after restore and init fails the first call of
    any function reading it (`Could not find variable ...`)."""
    import tensorflow as tf

    names = [n.name for n in meta_graph.graph_def.node if n.op == "VarHandleOp"]
    checks = [tf.raw_ops.VarIsInitializedOp(resource=graph.get_tensor_by_name(f"{name}:0")) for name in names]
    return names, checks


def _telling(exc: BaseException) -> str:
    """The telling line of TF's message (telling.py), and the node it names."""
    text = getattr(exc, "message", None) or str(exc)
    first = telling_line(text) or type(exc).__name__
    node = next((m.group(1) or m.group(2) for m in map(_NODE.search, text.splitlines()) if m), None)
    if node and node not in first:
        return f"{first} (node {node})"
    return first
