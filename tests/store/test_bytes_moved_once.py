"""Issue 54 item 2, no byte moved twice: a stage's output that is a hard link of an object
(variables the stage left unchanged) is stored as that object, the same inode, without
being read again. Measured by the kernel's own counters of this thread
(tpubuild/io_counters.py: rchar counts every read-like call, page cache or not)."""

from __future__ import annotations

import os

from tpubuild import io_counters
from tpubuild.digests import StatCache
from tpubuild.store import Store

# Below hashing.py's THREADED_MIN_SIZE (4 MiB): a hash reads it with pread, which rchar
# counts (a memory-mapped read of a larger file is in no char count).
SIZE = 3 << 20


def _read_while(action) -> int:
    before = io_counters.read(io_counters.THREAD)
    result = action()
    grown = io_counters.since(before, io_counters.THREAD)
    assert grown is not None, "no /proc/thread-self/io on this machine"
    return grown["rchar"], result


def test_unchanged_variables_are_the_inputs_inode_and_not_read_again(tmp_path):
    store = Store(tmp_path / "cache")
    first = store.new_workdir("stage") / "out"
    (first / "variables").mkdir(parents=True)
    (first / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(SIZE))
    (first / "saved_model.pb").write_bytes(b"first")
    cache = StatCache(None)
    input_entry = store.put("a" * 64, "tpu", first, {}, [], {}, cache)
    checkout = store.checkout(input_entry)
    # The next stage rewrites only the graph: its output links the input's variables, as
    # SavedModel.save does (savedmodel/model.py _link_tree).
    out = store.new_workdir("stage") / "out"
    (out / "variables").mkdir(parents=True)
    os.link(checkout / "variables" / "variables.data-00000-of-00001", out / "variables" / "variables.data-00000-of-00001")
    (out / "saved_model.pb").write_bytes(b"second")
    read, entry = _read_while(lambda: store.put("b" * 64, "batch", out, {}, [], {}, cache))
    assert read < SIZE // 2, f"storing a linked {SIZE:,}-byte variables file read {read:,} bytes"
    variables = {f.path: f.hash for f in input_entry.files}["variables/variables.data-00000-of-00001"]
    assert {f.path: f.hash for f in entry.files}["variables/variables.data-00000-of-00001"] == variables
    again = store.checkout(entry)
    # One inode: the object, in both stages' checkouts.
    inodes = {os.stat(p).st_ino for p in (store.object_path(variables),
                                          checkout / "variables" / "variables.data-00000-of-00001",
                                          again / "variables" / "variables.data-00000-of-00001")}
    assert len(inodes) == 1


def test_a_copy_of_an_object_is_hashed_not_trusted(tmp_path):
    """Only the object's own inode, its stat unchanged, is trusted without reading: a file
    of another inode is hashed, whatever it claims to be."""
    store = Store(tmp_path / "cache")
    first = store.new_workdir("stage") / "out"
    first.mkdir(parents=True, exist_ok=True)
    data = os.urandom(SIZE)
    (first / "w").write_bytes(data)
    cache = StatCache(None)
    store.put("a" * 64, "tpu", first, {}, [], {}, cache)
    out = store.new_workdir("stage") / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "w").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, another inode, one bit changed
    read, entry = _read_while(lambda: store.put("b" * 64, "batch", out, {}, [], {}, cache))
    assert read >= SIZE
    assert store.object_path(entry.files[0].hash).read_bytes() != data
