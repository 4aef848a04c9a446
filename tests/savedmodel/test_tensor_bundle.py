"""tpubuild/savedmodel/tensor_bundle.py and the checkpoint rewrites built on it
(checkpoint.write_bfloat16, write_without): byte for byte what TensorFlow writes, read back
by TensorFlow, sharded checkpoints kept sharded, corrupt bytes refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tpubuild.savedmodel import checkpoint, tensor_bundle
from tpubuild.savedmodel.checkpoint import OBJECT_GRAPH_KEY, PREFIX


def _tensors(count: int) -> dict[str, np.ndarray]:
    """`count` small tensors of every kind the format stores differently: the dtypes of
    weights and of counters, scalars, 0-size tensors, strings (empty ones too), and names
    long enough that the index spans several blocks (table_options.h block_size 256 KiB)."""
    rng = np.random.default_rng(54)
    kinds = [
        lambda: rng.normal(size=(3, 5)).astype(np.float32),
        lambda: np.asarray(tf.cast(rng.normal(size=(7,)).astype(np.float32), tf.bfloat16)),
        lambda: rng.integers(-2**40, 2**40, size=(2, 2)).astype(np.int64),
        lambda: rng.integers(0, 2, size=(4,)).astype(bool),
        lambda: rng.normal(size=(2, 3)).astype(np.float16),
        lambda: np.float32(rng.normal()),  # a scalar
        lambda: np.zeros((0, 3), np.float32),  # 0 elements
        lambda: np.array([b"", b"abc", bytes(range(256))], dtype=object),
        lambda: np.array(b"a scalar string", dtype=object),
        lambda: np.array([], dtype=object),
    ]
    return {f"layer_{i:05d}/{'x' * 60}/kernel/.ATTRIBUTES/VARIABLE_VALUE": kinds[i % len(kinds)]()
            for i in range(count)}


def _save_v2(prefix: Path, names: list[str], values: list[np.ndarray]) -> None:
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(v) for v in values])


def _add(writer: tensor_bundle.Writer, name: str, value: np.ndarray, shard: int = 0) -> None:
    dtype = tf.as_dtype(value.dtype if value.dtype != object else tf.string).as_datatype_enum
    if dtype == tensor_bundle.DT_STRING:
        writer.add_strings(name.encode(), list(value.shape), list(value.reshape(-1)), shard)
    else:
        writer.add(name.encode(), dtype, list(value.shape), [value.tobytes()], shard)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_the_writer_writes_what_save_v2_writes(tmp_path: Path) -> None:
    tensors = _tensors(4800)
    names = list(tensors)[::-1]  # not in key order: the data file keeps the order they were added in
    _save_v2(tmp_path / "tf" / "ckpt", names, [tensors[n] for n in names])
    (tmp_path / "ours").mkdir()
    with tensor_bundle.Writer(tmp_path / "ours" / "ckpt") as writer:
        for name in names:
            _add(writer, name, tensors[name])
    theirs, ours = _files(tmp_path / "tf"), _files(tmp_path / "ours")
    assert sorted(theirs) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    assert len(theirs["ckpt.index"]) > 2 * tensor_bundle.BLOCK_SIZE  # several data blocks in the index
    assert ours == theirs


def test_the_reader_reads_what_tensorflow_reads(tmp_path: Path) -> None:
    tensors = _tensors(300)
    _save_v2(tmp_path / "ckpt", list(tensors), list(tensors.values()))
    tf_reader = tf.train.load_checkpoint(str(tmp_path / "ckpt"))
    with tensor_bundle.Reader.open(tmp_path / "ckpt") as reader:
        assert sorted(reader.entries) == sorted(n.encode() for n in tensors)
        for name, value in tensors.items():
            entry = reader.entries[name.encode()]
            assert entry.dtype == tf.as_dtype(tf_reader.get_variable_to_dtype_map()[name]).as_datatype_enum
            if value.dtype == object:
                assert reader.strings(name.encode()) == list(np.asarray(tf_reader.get_tensor(name), object).reshape(-1))
            else:
                data = b"".join(reader.chunks(name.encode(), chunk=7))  # chunks that split elements
                assert data == np.ascontiguousarray(tf_reader.get_tensor(name)).tobytes()


class Stack(tf.Module):
    def __init__(self) -> None:
        rng = np.random.default_rng(3)
        self.kernels = [tf.Variable(rng.normal(size=(40, 40)).astype(np.float32), name=f"k{i}") for i in range(8)]
        self.steps = tf.Variable(np.arange(5, dtype=np.int64), name="steps")

    @tf.function(input_signature=[tf.TensorSpec([None, 40], tf.float32)])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for kernel in self.kernels:
            x = tf.tanh(x @ kernel)
        return x


def save_sharded(path: Path, max_shard_size: int) -> Path:
    """A SavedModel whose checkpoint is sharded (tensors sliced across shards too)."""
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=max_shard_size)
    tf.saved_model.save(Stack(), str(path), options=tf.saved_model.SaveOptions(experimental_sharding_callback=policy))
    return path


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sharded(tmp_path_factory.mktemp("sharded") / "model", 10000)


def _shards(model: Path) -> list[str]:
    return sorted(p.name for p in (model / "variables").iterdir() if ".data-" in p.name)


def test_a_sharded_checkpoint_is_written_back_byte_for_byte(sharded: Path, tmp_path: Path) -> None:
    with tensor_bundle.Reader.open(sharded / PREFIX) as reader:
        assert reader.header.num_shards == len(_shards(sharded)) > 3
        assert any(e.slices for e in reader.entries.values())  # sliced across shards
        with tensor_bundle.Writer(tmp_path / "ckpt", reader.header.num_shards, reader.header.version) as writer:
            for key in reader.in_file_order():  # decoded and encoded again, not copied
                entry = reader.entries[key]
                shape = [d.size for d in entry.shape.dim]
                if entry.dtype == tensor_bundle.DT_STRING:
                    writer.add_strings(key, shape, reader.strings(key), entry.shard_id)
                else:
                    writer.add(key, entry.dtype, shape, list(reader.chunks(key)), entry.shard_id)
            for key, entry in reader.entries.items():
                if entry.slices:
                    writer.add_metadata(key, entry)
    source = {n.replace("variables", "ckpt"): b for n, b in _files(sharded / "variables").items()}
    assert _files(tmp_path) == source


def _copy(model: Path, to: Path) -> Path:
    """A stage's output as SavedModel.save leaves it: every file a hard link to its input's."""
    shutil.copytree(model, to, copy_function=os.link)
    return to


def test_bfloat16_of_a_sharded_checkpoint_keeps_its_shards(sharded: Path, tmp_path: Path) -> None:
    out = _copy(sharded, tmp_path / "out")
    before = _files(sharded / "variables")
    keys = {f"kernels/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(0, 8, 2)}
    checkpoint.write_bfloat16(sharded, out, keys)
    assert _files(sharded / "variables") == before  # the links were replaced, not written through
    assert _shards(out) == _shards(sharded)
    src, dst = tensor_bundle.Reader.open(sharded / PREFIX), tensor_bundle.Reader.open(out / PREFIX)
    assert sorted(src.entries) == sorted(dst.entries)
    for key, entry in src.entries.items():
        assert dst.entries[key].shard_id == entry.shard_id  # each tensor (slice) in its shard
    tf_src, tf_dst = tf.train.load_checkpoint(str(sharded / PREFIX)), tf.train.load_checkpoint(str(out / PREFIX))
    for name, dtype in tf_src.get_variable_to_dtype_map().items():
        if name in keys:
            assert tf_dst.get_variable_to_dtype_map()[name] == tf.bfloat16
            expected = tf.cast(tf_src.get_tensor(name), tf.bfloat16).numpy()  # TF's rounding, bit for bit
            assert tf_dst.get_tensor(name).tobytes() == expected.tobytes()
        else:
            assert tf_dst.get_variable_to_dtype_map()[name] == dtype
            assert np.asarray(tf_dst.get_tensor(name)).tobytes() == np.asarray(tf_src.get_tensor(name)).tobytes()
    assert not [p for p in (out / "variables").iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_cast_in_chunks_is_the_cast_of_the_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(7).normal(size=(1000, 37)).astype(np.float32) * 1e3
    values[0, :4] = [np.inf, -np.inf, np.nan, 3.0e38]  # and the values rounding must not lose
    (tmp_path / "src" / "variables").mkdir(parents=True)
    _save_v2(tmp_path / "src" / "variables" / "variables", ["w", OBJECT_GRAPH_KEY], [values, np.array(b"g", object)])
    out = _copy(tmp_path / "src", tmp_path / "out")
    monkeypatch.setattr(tensor_bundle, "CHUNK", 4096)  # 36 chunks, none on a row's boundary
    checkpoint.write_bfloat16(tmp_path / "src", out, {"w"})
    got = tf.train.load_checkpoint(str(out / PREFIX)).get_tensor("w")
    assert got.dtype == tf.bfloat16.as_numpy_dtype
    assert got.tobytes() == tf.cast(values, tf.bfloat16).numpy().tobytes()


def test_write_without_drops_a_sliced_variable_and_replaces_the_object_graph(sharded: Path, tmp_path: Path) -> None:
    out = _copy(sharded, tmp_path / "out")
    with tensor_bundle.Reader.open(sharded / PREFIX) as reader:
        sliced = next(k.decode() for k, e in reader.entries.items() if e.slices)
    checkpoint.write_without(sharded, out, {sliced}, b"a new object graph")
    with tensor_bundle.Reader.open(out / PREFIX) as reader:
        assert not [k for k in reader.entries if k.startswith(checkpoint.slice_key_prefix(sliced.encode()))]
        assert reader.header.num_shards == len(_shards(sharded))
    tf_out = tf.train.load_checkpoint(str(out / PREFIX))
    assert sliced not in tf_out.get_variable_to_dtype_map()
    assert tf_out.get_tensor(OBJECT_GRAPH_KEY) == b"a new object graph"
    kept = set(tf.train.load_checkpoint(str(sharded / PREFIX)).get_variable_to_dtype_map()) - {sliced}
    assert set(tf_out.get_variable_to_dtype_map()) == kept


def test_bfloat16_of_one_shard_agrees_with_the_save_v2_path(tmp_path: Path) -> None:
    model = Stack()
    tf.saved_model.save(model, str(tmp_path / "src"))
    out = _copy(tmp_path / "src", tmp_path / "out")
    keys = {f"kernels/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(8)}
    checkpoint.write_bfloat16(tmp_path / "src", out, keys)
    assert _shards(out) == ["variables.data-00000-of-00001"]
    reader = tf.train.load_checkpoint(str(out / PREFIX))
    assert reader.get_variable_to_dtype_map()["kernels/0/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    # The same bytes as the SaveV2 path that held every tensor at once, up to the order
    # of the data file (the source's order here, sorted there): the index's entries agree
    # but for their offsets.
    whole = _copy(tmp_path / "src", tmp_path / "whole")
    checkpoint._write_bfloat16_whole(tmp_path / "src", whole, keys)
    ours, theirs = tensor_bundle.Reader.open(out / PREFIX), tensor_bundle.Reader.open(whole / PREFIX)
    strip = {k: (e.dtype, e.shape, e.size, e.crc32c) for k, e in ours.entries.items()}
    assert strip == {k: (e.dtype, e.shape, e.size, e.crc32c) for k, e in theirs.entries.items()}
    # fingerprint.pb's checkpoint_hash is of the new variables.index
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    written = fingerprint_pb2.FingerprintDef.FromString((out / "fingerprint.pb").read_bytes())
    fresh = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(str(out)))
    source = fingerprint_pb2.FingerprintDef.FromString((tmp_path / "src" / "fingerprint.pb").read_bytes())
    assert written.checkpoint_hash == fresh.checkpoint_hash != source.checkpoint_hash


def test_a_corrupt_tensor_is_refused_and_the_checkpoint_left_as_it_was(tmp_path: Path) -> None:
    tf.saved_model.save(Stack(), str(tmp_path / "src"))
    data = tmp_path / "src" / "variables" / "variables.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0x01  # inside the first tensor's bytes
    data.write_bytes(bytes(raw))
    out = _copy(tmp_path / "src", tmp_path / "out")
    before = _files(out / "variables")
    for rewrite in (lambda: checkpoint.write_bfloat16(tmp_path / "src", out, {"kernels/0/.ATTRIBUTES/VARIABLE_VALUE"}),
                    lambda: checkpoint.write_without(tmp_path / "src", out, set(), b"graph")):
        with pytest.raises(tensor_bundle.DataLoss, match="does not match its checksum"):
            rewrite()
        assert _files(out / "variables") == before


def test_a_corrupt_index_block_is_refused(tmp_path: Path) -> None:
    _save_v2(tmp_path / "ckpt", ["a"], [np.ones(3, np.float32)])
    index = tmp_path / "ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[3] ^= 0x01
    index.write_bytes(bytes(raw))
    with pytest.raises(tensor_bundle.DataLoss, match="block checksum mismatch"):
        tensor_bundle.Reader.open(tmp_path / "ckpt")


def test_mask_is_crc32c_h_mask() -> None:
    # crc32c.h: Mask(crc) = ((crc >> 15) | (crc << 17)) + kMaskDelta; known value of "123456789"
    assert tensor_bundle.crc32c(b"123456789") == 0xE3069283
    for crc in (0, 1, 0xE3069283, 0xFFFFFFFF):
        assert tensor_bundle.unmask(tensor_bundle.mask(crc)) == crc


@pytest.mark.parametrize("max_shard_size", [1 << 20, 15000, 5000])
def test_reshard_lays_the_tensors_out_in_files_of_a_size(sharded: Path, tmp_path: Path, max_shard_size: int) -> None:
    out = _copy(sharded, tmp_path / "out")
    summary = checkpoint.reshard(sharded, out, max_shard_size)
    files = _shards(out)
    assert summary["before"] == len(_shards(sharded)) and summary["shards"] == len(files)
    with tensor_bundle.Reader.open(sharded / PREFIX) as src, tensor_bundle.Reader.open(out / PREFIX) as dst:
        assert dst.header.num_shards == len(files)
        sizes = [(out / "variables" / name).stat().st_size for name in files]
        for shard, size in enumerate(sizes):
            held = [k for k, e in dst.entries.items() if not e.slices and e.shard_id == shard]
            assert size <= max_shard_size or len(held) == 1  # over the size: one tensor alone
        # The source's order, packed: a file ends only where the next tensor would not fit.
        order = dst.in_file_order()
        assert order == src.in_file_order()
        for before, after in zip(order, order[1:]):
            a, b = dst.entries[before], dst.entries[after]
            if a.shard_id != b.shard_id:
                assert sizes[a.shard_id] + b.size > max_shard_size
        assert summary["oversized"] == sum(1 for k in order if src.entries[k].size > max_shard_size)
        for key, entry in src.entries.items():  # the bytes and checksums as they were
            got = dst.entries[key]
            assert (got.dtype, got.shape, got.size, got.crc32c, list(got.slices)) == \
                (entry.dtype, entry.shape, entry.size, entry.crc32c, list(entry.slices))
    if max_shard_size == 1 << 20:
        assert files == ["variables.data-00000-of-00001"]
    tf_src, tf_out = tf.train.load_checkpoint(str(sharded / PREFIX)), tf.train.load_checkpoint(str(out / PREFIX))
    for name in tf_src.get_variable_to_dtype_map():
        assert np.asarray(tf_out.get_tensor(name)).tobytes() == np.asarray(tf_src.get_tensor(name)).tobytes()


def test_every_truncated_or_flipped_index_is_data_loss_or_read(tmp_path: Path) -> None:
    _save_v2(tmp_path / "ckpt", ["a", "b/c"], [np.ones(3, np.float32), np.array(b"s", dtype=object)])
    index = tmp_path / "ckpt.index"
    good = index.read_bytes()
    broken = [good[:n] for n in range(len(good))]
    broken += [good[:i] + bytes([good[i] ^ 0x55]) + good[i + 1:] for i in range(len(good))]
    for raw in broken:
        index.write_bytes(raw)
        try:
            tensor_bundle.Reader.open(tmp_path / "ckpt")  # a flip in the footer's padding reads fine
        except tensor_bundle.DataLoss as exc:  # one line naming the file, never a struct.error or IndexError
            assert str(exc).startswith(f"{index}: ") and "\n" not in str(exc)


def _cast_by_rewrite(tmp_path: Path, value: np.ndarray) -> np.ndarray:
    """`value` saved as variable "w" by TensorFlow, cast to bfloat16 by checkpoint._rewrite,
    read back by TensorFlow's checkpoint reader."""
    src = tmp_path / "src" / "variables"
    src.mkdir(parents=True)
    _save_v2(src / "variables", ["w"], [value])
    out = tmp_path / "out"
    (out / "variables").mkdir(parents=True)
    with tensor_bundle.Reader.open(src / "variables") as reader:
        checkpoint._rewrite(reader, out / PREFIX, cast={b"w"}, drop=set(), object_graph=None)
    return tf.train.load_checkpoint(str(out / PREFIX)).get_tensor("w")


def test_the_streamed_bfloat16_cast_is_tf_cast_bit_for_bit(tmp_path: Path) -> None:
    """bfloat16 casts float32 with ml_dtypes into reused buffers (checkpoint._cast_bfloat16);
    its bits must be tf.cast's on every float32 pattern that matters: ties rounded to even,
    infinities, subnormals, the largest finite value, and NaNs of either sign and any payload
    (tf.cast writes each as 0x7fc0, ml_dtypes would keep a negative one's sign). One tensor
    spans several chunks (tensor_bundle.CHUNK), so chunking is covered too."""
    rng = np.random.default_rng(0)
    special = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0xFFFFFFFF,
                        0x00000001, 0x80000001, 0x007FFFFF, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF,
                        0x7F7F8000, 0, 0x80000000], dtype=np.uint32)
    count = tensor_bundle.CHUNK // 4 * 2 + 1000  # two whole chunks and part of a third
    bits = np.concatenate([special, rng.integers(0, 2**32, count - special.size, dtype=np.uint64).astype(np.uint32)])
    value = bits.view(np.float32)
    written = _cast_by_rewrite(tmp_path, value)
    expected = tf.cast(tf.constant(value), tf.bfloat16).numpy()
    assert written.dtype == expected.dtype
    np.testing.assert_array_equal(written.view(np.uint16), expected.view(np.uint16))
    assert (expected.view(np.uint16)[[2, 3, 5, 6]] == 0x7FC0).all()  # the NaNs, as tf.cast writes them


def test_a_lone_nan_in_a_chunk_of_ordinary_weights_is_cast_as_tf_cast_casts_it(tmp_path: Path) -> None:
    """The NaN search runs only on a chunk whose float32 sum is not finite (checkpoint.
    _cast_bfloat16): a chunk of ordinary weights, one holding a single negative NaN, one
    whose infinities of both signs sum to NaN, one whose finite values overflow the sum."""
    per_chunk = tensor_bundle.CHUNK // 4
    value = np.random.default_rng(1).standard_normal(per_chunk * 4).astype(np.float32)
    value.view(np.uint32)[per_chunk + 12345] = 0xFFC01234  # chunk 2: one NaN, negative, with a payload
    value[2 * per_chunk + 7], value[2 * per_chunk + 9] = np.inf, -np.inf  # chunk 3: inf + -inf
    value[3 * per_chunk:3 * per_chunk + 64] = 3.0e38  # chunk 4: a sum past float32's range, no NaN
    written = _cast_by_rewrite(tmp_path, value)
    expected = tf.cast(tf.constant(value), tf.bfloat16).numpy()
    np.testing.assert_array_equal(written.view(np.uint16), expected.view(np.uint16))
    assert written.view(np.uint16)[per_chunk + 12345] == 0x7FC0


REFUSED_WRITE = r"""
import os, resource, signal, sys
from pathlib import Path
from tpubuild.savedmodel import tensor_bundle
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
prefix = Path(sys.argv[1]) / "variables"
pieces = int(sys.argv[2])
piece = bytes((4 << 20) // pieces)
try:
    with tensor_bundle.Writer(prefix) as writer:
        writer.add(b"w", 1, [16, 1 << 16], (piece for _ in range(pieces)))  # 4 MiB in pieces
except OSError as exc:
    print(exc.errno, sorted(os.listdir(sys.argv[1])))
"""


@pytest.mark.parametrize("pieces", [16, 1], ids=["by_the_thread", "inline"])
def test_a_write_the_file_system_refuses_fails_the_tensor_and_leaves_nothing(tmp_path: Path, pieces: int) -> None:
    """Writer.add's pieces are written by a thread (tensor_bundle._Writes), a tensor of one
    piece inline: the kernel's refusal of one (EFBIG past a file size limit, as ENOSPC on a
    full disk) is raised by add itself, and the writer's temporary data file is removed."""
    import errno
    import subprocess
    import sys

    from tests.cli import REPO

    done = subprocess.run([sys.executable, "-c", REFUSED_WRITE, str(tmp_path), str(pieces)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [str(errno.EFBIG), "[]\n"], done.stdout
