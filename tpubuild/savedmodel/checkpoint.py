"""The variables checkpoint of a SavedModel: keys by object-graph node; the rewrites (bfloat16,
variables dropped, resharded), streamed a tensor at a time through tensor_bundle.py."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorflow.core.protobuf import tensor_bundle_pb2, trackable_object_graph_pb2

from tpubuild.savedmodel import tensor_bundle
from tpubuild.savedmodel.model import SavedModel

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
PREFIX = Path("variables") / "variables"
DT_BFLOAT16 = 14  # tensorflow/core/framework/types.proto


def _reader(model_dir: Path):
    import tensorflow as tf

    return tf.train.load_checkpoint(str(model_dir / PREFIX))


def checkpoint_keys(model: SavedModel, node_ids: set[int]) -> set[str]:
    """Checkpoint keys (`w/.ATTRIBUTES/VARIABLE_VALUE`) of the given object-graph nodes."""
    if not node_ids:
        return set()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(_reader(model.path).get_tensor(OBJECT_GRAPH_KEY))
    return {
        attr.checkpoint_key
        for node_id in node_ids
        for attr in graph.nodes[node_id].attributes
        if attr.name == "VARIABLE_VALUE"
    }


def write_bfloat16(src_dir: Path, out_dir: Path, keys: set[str]) -> None:
    """Rewrite out_dir's checkpoint with `keys` stored as bfloat16 (same keys, same values
    rounded by TensorFlow's cast, the source's shards and order kept). One tensor at a time
    (tensor_bundle.py), a chunk of it at a time: the peak is a chunk, not the model; the
    tensors that do not change are copied as their bytes, checked against their crc.
    The files are written beside the published ones and renamed into place, so hardlinks
    to the source checkpoint are replaced, never written through."""
    try:
        reader = tensor_bundle.Reader.open(src_dir / PREFIX)
    except tensor_bundle.Unsupported:
        _write_bfloat16_whole(src_dir, out_dir, keys)
    else:
        with reader:
            _rewrite(reader, out_dir / PREFIX, cast={k.encode() for k in keys}, drop=set(), object_graph=None)
    _refresh_fingerprint(out_dir)


def write_without(src_dir: Path, out_dir: Path, keys: set[str], object_graph: bytes) -> None:
    """Rewrite out_dir's checkpoint without `keys` and with a new object graph (after
    variables were removed from the SavedModel); as `write_bfloat16`: tensor by tensor,
    shards kept (a shard left with no tensor is an empty file), the files renamed into
    place, so hardlinks to the source checkpoint are never written through."""
    try:
        reader = tensor_bundle.Reader.open(src_dir / PREFIX)
    except tensor_bundle.Unsupported:
        _write_without_whole(src_dir, out_dir, keys, object_graph)
    else:
        with reader:
            _rewrite(reader, out_dir / PREFIX, cast=set(), drop={k.encode() for k in keys}, object_graph=object_graph)
    _refresh_fingerprint(out_dir)


def reshard(src_dir: Path, out_dir: Path, max_shard_size: int) -> dict[str, int]:
    """Rewrite out_dir's checkpoint in data files of at most `max_shard_size` bytes: the
    tensors (slices of a sliced tensor too) in the source's order, each copied as its bytes,
    a new file when the next tensor would pass the size. A tensor larger than the size is a
    file of its own, not sliced (TensorFlow's MaxShardSizePolicy slices it; reading is the
    same either way). Returns {"before", "shards", "largest_shard", "oversized"}."""
    from tpubuild.errors import ConversionError

    try:
        reader = tensor_bundle.Reader.open(src_dir / PREFIX)
    except tensor_bundle.Unsupported as exc:
        raise ConversionError(f"variables.max_shard_size: the checkpoint cannot be resharded ({exc})") from None
    with reader:
        order = reader.in_file_order()
        shard_of, sizes = {}, [0]
        for key in order:
            size = reader.entries[key].size
            if sizes[-1] and sizes[-1] + size > max_shard_size:
                sizes.append(0)
            shard_of[key] = len(sizes) - 1
            sizes[-1] += size
        with tensor_bundle.Writer(out_dir / PREFIX, len(sizes), reader.header.version) as writer:
            for key in order:
                entry = reader.entries[key]
                if entry.dtype == tensor_bundle.DT_STRING:
                    writer.add_raw(key, entry, [tensor_bundle.string_bytes(reader.strings(key))[0]], shard_of[key])
                else:
                    writer.add_raw(key, entry, reader.chunks(key), shard_of[key])
            for key, entry in reader.entries.items():
                if entry.slices:
                    writer.add_metadata(key, entry)
        summary = {"before": reader.header.num_shards, "shards": len(sizes), "largest_shard": max(sizes),
                   "oversized": sum(1 for k in order if reader.entries[k].size > max_shard_size)}
    _refresh_fingerprint(out_dir)
    return summary


def _refresh_fingerprint(model_dir: Path) -> None:
    """fingerprint.pb's checkpoint_hash is a hash of variables.index
    (tensorflow/cc/saved_model/fingerprinting.cc): computed again for the new index."""
    from tpubuild.savedmodel.reproducible import FINGERPRINT_PB, write_fingerprint

    if (model_dir / FINGERPRINT_PB).is_file():
        write_fingerprint(model_dir)


def slice_key_prefix(key: bytes) -> bytes:
    """What the keys of a sliced tensor's slices start with (a sharded save slices a tensor
    across shards, tensorflow/python/checkpoint/sharding/sharding_policies.py): the
    name as tensorflow/core/util/saved_tensor_slice_util.cc EncodeTensorNameSlice writes
    it, OrderedCode (tensorflow/core/lib/strings/ordered_code.cc) WriteNumIncreasing(0)
    then WriteString(name): 0x00 and 0xff escaped as 0x00 0xff and 0xff 0x00, ended by
    0x00 0x01 (a terminator no escaped name holds)."""
    escaped = b"".join(b"\x00\xff" if b == 0 else b"\xff\x00" if b == 0xFF else bytes([b]) for b in key)
    return b"\x00" + escaped + b"\x00\x01"


def _owners(reader: tensor_bundle.Reader, keys: set[bytes]) -> set[bytes]:
    """`keys` and the keys of their slices."""
    prefixes = tuple(slice_key_prefix(k) for k in keys if reader.entries.get(k) is not None
                     and reader.entries[k].slices)
    return set(keys) | ({k for k in reader.entries if k.startswith(prefixes)} if prefixes else set())


def _rewrite(reader: tensor_bundle.Reader, prefix: Path, cast: set[bytes], drop: set[bytes],
             object_graph: bytes | None) -> None:
    """The reader's checkpoint again at `prefix`: the same shards, each tensor in its shard
    at its place in the source's order; `cast` (and their slices) as bfloat16, `drop` (and
    theirs) left out, the object graph replaced when given."""
    cast, drop = _owners(reader, cast), _owners(reader, drop)
    graph_key = OBJECT_GRAPH_KEY.encode()
    # One read buffer and one cast buffer for every tensor (tensor_bundle.Reader.views): no
    # new memory per chunk.
    import numpy as np

    # The cast's buffers in turn: Writer.add writes one while the next is cast (WRITE_AHEAD).
    buffers = _Buffers(np.empty(tensor_bundle.CHUNK, np.uint8),
                       [np.empty(tensor_bundle.CHUNK, np.uint8) for _ in range(tensor_bundle.WRITE_AHEAD + 2)])
    with tensor_bundle.Writer(prefix, reader.header.num_shards, reader.header.version) as writer:
        for key in reader.in_file_order():
            entry = reader.entries[key]
            shape = [d.size for d in entry.shape.dim]
            if key in drop:
                continue
            if key == graph_key and object_graph is not None:
                writer.add_strings(key, shape, [object_graph], entry.shard_id)
            elif key in cast:
                writer.add(key, DT_BFLOAT16, shape, _cast_bfloat16(reader, key, buffers), entry.shard_id)
            elif entry.dtype == tensor_bundle.DT_STRING:
                writer.add_raw(key, entry, [tensor_bundle.string_bytes(reader.strings(key))[0]], entry.shard_id)
            else:
                writer.add_raw(key, entry, reader.views(key, buffers.read), entry.shard_id)
        for key, entry in reader.entries.items():
            if entry.slices and key not in drop:
                if key in cast:
                    entry = tensor_bundle_pb2.BundleEntryProto.FromString(entry.SerializeToString())
                    entry.dtype = DT_BFLOAT16  # type: ignore[assignment]
                writer.add_metadata(key, entry)


@dataclass
class _Buffers:
    read: Any  # uint8 numpy arrays: a chunk of the source tensor
    cast: list[Any]  # its cast (half of each is used: float32 to bfloat16), one after another


# A NaN in bfloat16: exponent all ones, a mantissa bit set; tf.cast writes every NaN as
# 0x7fc0 (TF 2.21, measured on 2**24 random float32 bit patterns: ml_dtypes keeps a
# negative NaN's sign, 0xffc0, and agrees with tf.cast on every other value, rounding
# to nearest even, infinities and subnormals included).
BF16_EXPONENT_MASK, BF16_QUIET_NAN = 0x7F80, 0x7FC0


def _cast_bfloat16(reader: tensor_bundle.Reader, key: bytes, buffers: _Buffers) -> Iterator[Any]:
    """The tensor's bytes cast to bfloat16 as tf.cast casts them, a chunk at a time (round
    to nearest even; the cast is elementwise, so chunking does not change a bit). A chunk
    is a whole number of elements (tensor_bundle.CHUNK is a multiple of every element size).
    float32, nearly every weight: cast by ml_dtypes into a reused buffer, NaNs then written
    as tf.cast writes them (no new memory per chunk: Reader.views); other dtypes by tf.cast."""
    import numpy as np
    import tensorflow as tf

    entry = reader.entries[key]
    numpy_dtype = np.dtype(tf.dtypes.as_dtype(entry.dtype).as_numpy_dtype)
    elements = 1
    for dim in entry.shape.dim:
        elements *= dim.size
    if entry.size != elements * numpy_dtype.itemsize:  # TensorFlow's reader refuses it too (BundleReader::GetValue)
        raise tensor_bundle.DataLoss(f"{reader.data_file(entry.shard_id)}: {key.decode(errors='replace')} holds "
                                     f"{entry.size} bytes, not the {elements * numpy_dtype.itemsize} of its shape")
    if numpy_dtype != np.float32:
        for piece in reader.chunks(key):
            yield tf.cast(np.frombuffer(piece, numpy_dtype), tf.bfloat16).numpy().tobytes()
        return
    import ml_dtypes

    for turn, piece in enumerate(reader.views(key, buffers.read)):
        into = buffers.cast[turn % len(buffers.cast)]  # not one Writer.add may still be writing
        source = piece.view(np.float32)
        out = into.view(ml_dtypes.bfloat16)[:source.size]
        with np.errstate(invalid="ignore", over="ignore"):  # NaN is cast as NaN: no warning
            np.copyto(out, source, casting="unsafe")
            # A NaN anywhere makes the sum NaN (IEEE 754): only then are the bits searched.
            # The sum reads the chunk at ~15 GiB/s; the search, two temporaries a chunk,
            # halved the cast's speed (issue 54: 1.5 GiB/s of float32 with it, 2-3.6 without).
            suspect = not np.isfinite(np.sum(source, dtype=np.float32))
        if suspect:
            bits = out.view(np.uint16)
            nan = (bits & 0x7FFF) > BF16_EXPONENT_MASK
            if nan.any():
                bits[nan] = BF16_QUIET_NAN
        yield into[:out.nbytes]


def _write_bfloat16_whole(src_dir: Path, out_dir: Path, keys: set[str]) -> None:
    """write_bfloat16 for a checkpoint tensor_bundle.py does not read (variant tensors, a
    big-endian or compressed bundle): TensorFlow's reader and one SaveV2 of every tensor,
    which holds the whole model in memory, as one shard."""
    import tensorflow as tf

    reader = _reader(src_dir)
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = []
    for name in names:
        value = tf.constant(reader.get_tensor(name))
        tensors.append(tf.cast(value, tf.bfloat16) if name in keys else value)
    _write(out_dir, names, tensors)


def _write(out_dir: Path, names: list[str], tensors: list) -> None:
    """SaveV2 into a staging directory beside out_dir's checkpoint, then rename into place."""
    import tensorflow as tf

    from tpubuild.atomic import fsync_path

    variables = out_dir / PREFIX.parent
    staging = Path(tempfile.mkdtemp(dir=variables, prefix=".ckpt-"))
    try:
        tf.raw_ops.SaveV2(
            prefix=str(staging / PREFIX.name),
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            tensors=tensors,
        )
        written = sorted(staging.iterdir())
        for path in written:
            fsync_path(path)
        for path in written:
            os.replace(path, variables / path.name)
        kept = {path.name for path in written}
        for stale in variables.iterdir():  # a sharded source's other data files
            if stale.name.startswith(f"{PREFIX.name}.data-") and stale.name not in kept:
                stale.unlink()
        fsync_path(variables)
    finally:
        for left in staging.iterdir():
            left.unlink()
        staging.rmdir()


def _write_without_whole(src_dir: Path, out_dir: Path, keys: set[str], object_graph: bytes) -> None:
    """write_without for what tensor_bundle.py does not read, as `_write_bfloat16_whole`."""
    import tensorflow as tf

    reader = _reader(src_dir)
    names = sorted(n for n in reader.get_variable_to_dtype_map() if n not in keys)
    tensors = [tf.constant(object_graph) if name == OBJECT_GRAPH_KEY else tf.constant(reader.get_tensor(name))
               for name in names]
    _write(out_dir, names, tensors)
