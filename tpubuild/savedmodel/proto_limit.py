"""Protobuf's 2 GiB limit on one message, met by SavedModels whose graph holds the weights
as constants: refused with one line naming the cause and the fix, never a protobuf error.

A serialized message is at most 2 GiB - 1 bytes (protobuf's int32 sizes: upb and C++
refuse to serialize or parse more; TensorFlow's own saver fails the same way, and since
TF 2.15 writes such a graph as `saved_model.cpb`, its chunked "image format", instead:
tensorflow/python/saved_model/save.py `experimental_image_format`, tools/proto_splitter).
Weights in variables live in `variables/`, outside the message, whatever their size; only
weights inlined as constants (Const nodes' tensor_content: a frozen graph, a converter
that closes over arrays) make the graph that large. So the fix is always the same: export
the weights as variables.

Checked where saved_model.pb is read (its file size, before parsing: `check_readable`) and
written (the serialized size, before writing: `serialize`). Not with ByteSize() ahead of
the write: upb computes it by serializing (measured, a 200 MB SavedModel: ByteSize 0.87 s,
SerializeToString 0.80 s), so a check first would double every write's cost; the write's
own serialization is checked instead, and its EncodeError over the limit caught.

TensorFlow-free (the planning commands' source check uses `cpb_hint`). `limit` arguments
default to LIMIT; tests pass a lowered one to check the logic on small protos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import ConversionError

LIMIT = 2**31 - 1  # protobuf's largest message, bytes (kint32max)
SAVED_MODEL_PB = "saved_model.pb"
CHUNKED_PB = "saved_model.cpb"  # TensorFlow's chunked graph: a SavedModel over the limit
FIX = ("export the weights as variables (tf.Variable objects, saved in variables/ outside the graph), "
       "not as constants inlined into the graph (a frozen graph, or arrays a traced function closes over)")


def gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def cpb_hint(directory: Path) -> str:
    """A reason for a SavedModel directory without saved_model.pb, when it holds TF's
    chunked saved_model.cpb instead; else ""."""
    if (Path(directory) / CHUNKED_PB).is_file():
        return (f"; it holds {CHUNKED_PB}, TensorFlow's chunked graph for one over protobuf's 2 GiB limit, "
                f"which tpubuild does not read: {FIX}")
    return ""


def check_readable(pb: Path, limit: int | None = None) -> None:
    """Refuse `pb` (a saved_model.pb) before reading it when protobuf cannot parse one
    message that large."""
    limit = LIMIT if limit is None else limit
    size = Path(pb).stat().st_size
    if size > limit:
        raise ConversionError(f"{pb}: {gib(size)}, over protobuf's {gib(limit + 1)} limit on one message, so it "
                              f"cannot be read: its graph holds the weights as constants; {FIX}")


def constant_bytes(proto: Any) -> int:
    """Bytes of constant tensor data in a SavedModel proto: its graphs' and functions'
    Const nodes (tensor_content and repeated values, as the proto holds them)."""
    total = 0
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
        for node in nodes:
            if node.op == "Const" and "value" in node.attr:
                total += node.attr["value"].tensor.ByteSize()
    return total


def serialize(proto: Any, where: Path | str, limit: int | None = None) -> bytes:
    """`proto` (a SavedModel) serialized deterministically for `where`/saved_model.pb, or
    a ConversionError when it is over protobuf's limit (what a stage's edits can make of a
    graph already near it)."""
    from google.protobuf.message import EncodeError

    limit = LIMIT if limit is None else limit
    try:
        data = proto.SerializeToString(deterministic=True)
    except (EncodeError, ValueError):  # upb: EncodeError; the C++ and pure-Python ones: ValueError
        data = None
    if data is None or len(data) > limit:
        size = f"{gib(len(data))}, " if data is not None else ""
        raise ConversionError(
            f"{Path(where) / SAVED_MODEL_PB}: the graph would be {size}over protobuf's {gib(limit + 1)} limit on one "
            f"message ({gib(constant_bytes(proto))} of it constants), so it cannot be written: {FIX}")
    return data
