"""The store, publishing and the stat cache on real files and real processes (issue 8
items 5, 6, 7, 10; issue 13 item 2): shared by workspaces and concurrent builds, copies
instead of shared inodes, no stale hash, nothing deleted that tpubuild did not publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import REPO
from tpubuild.digests import StatCache, hash_file, walk_files
from tpubuild.errors import StageError, UsageError
from tpubuild.publish import (
    MANIFEST,
    newest_holding,
    newest_matching,
    prune,
    publish,
    repair_newest,
)
from tpubuild.store import Store, collect


def _put(store: Store, key: str, files: dict[str, bytes], cache: StatCache | None = None):
    out = store.new_workdir("stage") / "out"
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return store.put(key, "stage", out, {}, [], {}, cache or StatCache(None))


def _manifest(recipe: str, entry) -> dict:
    return {"recipe": recipe, "content": entry.tree, "files": {f.path: f.hash for f in entry.files}}


def _pairs(store: Store, entry):
    return [(f, store.object_path(f.hash)) for f in entry.files]


def _workspace(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "tpubuild.yaml").write_text("cache_dir: ../shared-cache\n")
    return path


# --- issue 8.5: one store, several workspaces and concurrent builds --------------------

def test_gc_keeps_entries_another_registered_workspace_references(tmp_path):
    alpha, beta = _workspace(tmp_path / "alpha"), _workspace(tmp_path / "beta")
    store = Store(tmp_path / "shared-cache")
    a = _put(store, "a" * 64, {"saved_model.pb": b"alpha"})
    b = _put(store, "b" * 64, {"saved_model.pb": b"beta"})
    store.register_workspace(alpha, {"a" * 64})
    store.register_workspace(beta, {"b" * 64})
    store.close()
    # gc run from alpha, whose lock files know nothing of beta's entry
    result = collect(Store(tmp_path / "shared-cache"), {"a" * 64}, keep_days=0, max_size=None)
    assert (result.entries_removed, result.objects_removed) == (0, 0)
    assert store.get("b" * 64) is not None and store.object_path(b.files[0].hash).exists()
    # once beta is gone, its references go with it
    (beta / "tpubuild.yaml").unlink()
    result = collect(Store(tmp_path / "shared-cache"), {"a" * 64}, keep_days=0, max_size=None)
    assert (result.entries_removed, result.objects_removed) == (1, 1)
    assert store.get("b" * 64) is None and store.get("a" * 64) is not None
    assert store.object_path(a.files[0].hash).exists()


def test_register_a_build_of_some_recipes_keeps_the_others(tmp_path):
    ws = _workspace(tmp_path / "ws")
    store = Store(tmp_path / "shared-cache")
    store.register_workspace(ws, {"toy": {"k1"}, "other": {"k2"}})
    store.register_workspace(ws, {"toy": {"k3"}})
    assert store.workspace_references() == {str(ws.resolve()): {"k2", "k3"}}
    store.register_workspace(ws, {"k4"})  # gc: the whole workspace, from its lock files
    assert store.workspace_references() == {str(ws.resolve()): {"k4"}}


SESSION = """
import sys
from pathlib import Path
from tpubuild.store.store import Store
work = Store(Path(sys.argv[1])).new_workdir("export")
(work / "half-written").write_text("x")
print(work, flush=True)
sys.stdin.read()
"""


def test_temp_cleanup_never_deletes_a_live_builds_work_dir(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SESSION, str(tmp_path / "cache")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        work = Path(proc.stdout.readline().strip())
        store = Store(tmp_path / "cache")
        cleaned = store.clean_tmp()  # what another build does first
        assert (work / "half-written").read_text() == "x"
        assert cleaned == []
        with pytest.raises(UsageError, match="^a tpubuild build is still using the cache .*; gave up after 0.3 s$"):
            with store.exclusive(wait=0.3):  # what gc does
                pass
        proc.send_signal(signal.SIGKILL)  # its flock goes with it
        proc.wait()
        assert store.clean_tmp() == [work.parent.name]
        assert not work.exists() and os.listdir(store.tmp) == []
    finally:
        proc.kill()
        proc.wait()


def test_corrupt_object_keeps_a_readers_checkout_and_the_next_use_repairs_it(tmp_path):
    store, cache = Store(tmp_path / "cache"), StatCache(None)
    entry = _put(store, "k" * 64, {"saved_model.pb": b"model", "variables/v": b"weights"}, cache)
    checkout = store.checkout(entry)
    reader = open(checkout / "variables" / "v", "rb")  # a -j sibling reading its input
    obj = store.object_path(entry.files[1].hash)
    os.chmod(obj, 0o644)
    with open(obj, "r+b") as f:  # damage in place: checkouts are hard links of objects
        f.write(b"W")
    assert not store.verify(entry, StatCache(None))
    assert not obj.exists()
    assert (checkout / "saved_model.pb").read_bytes() == b"model"  # not deleted under the reader
    reader.close()
    rebuilt = _put(store, "k" * 64, {"saved_model.pb": b"model", "variables/v": b"weights"}, cache)
    assert store.checkout(rebuilt) == checkout
    assert (checkout / "variables" / "v").read_bytes() == b"weights"
    assert os.stat(checkout / "variables" / "v").st_ino == os.stat(obj).st_ino


def test_a_partial_checkout_is_repaired_not_trusted(tmp_path):
    """What a gc killed in the middle of deleting a checkout would leave (issue 8.10)."""
    store = Store(tmp_path / "cache")
    entry = _put(store, "k" * 64, {"saved_model.pb": b"model", "variables/v": b"weights"})
    checkout = store.checkout(entry)
    (checkout / "saved_model.pb").unlink()
    (checkout / "stray").write_text("left by a stage that wrote into its input")
    assert store.checkout(entry) == checkout
    assert sorted(rel for rel, _ in walk_files(checkout)) == ["saved_model.pb", "variables/v"]
    assert (checkout / "saved_model.pb").read_bytes() == b"model"


def test_symlinks_and_fifos_in_a_stage_output_are_rejected(tmp_path):
    store = Store(tmp_path / "cache")
    for make, what in ((lambda p: p.symlink_to("/etc/hostname"), "a symbolic link (to /etc/hostname)"),
                       (os.mkfifo, "a FIFO (named pipe)")):
        out = store.new_workdir("stage") / "out"
        (out / "assets").mkdir(parents=True)
        make(out / "assets" / "x")
        with pytest.raises(StageError) as info:
            store.put("k" * 64, "stage", out, {}, [], {}, StatCache(None))
        assert str(info.value).startswith(f"{out / 'assets' / 'x'}: {what}")
        assert store.get("k" * 64) is None


def test_walk_files_follows_links_inside_the_tree_only(tmp_path):
    tree = tmp_path / "model"
    (tree / "variables").mkdir(parents=True)
    (tree / "variables" / "v").write_text("w")
    (tree / "alias").symlink_to("variables/v")
    assert [rel for rel, _ in walk_files(tree)] == ["alias", "variables/v"]
    (tree / "outside").symlink_to(tmp_path)
    with pytest.raises(StageError, match=f"^{tree / 'outside'}: a symbolic link to {tmp_path}, outside {tree}$"):
        walk_files(tree)


# --- issue 8.6: publishing never shares an inode with the cache by default -------------

def test_published_copies_share_no_inode_with_the_cache(tmp_path):
    store = Store(tmp_path / "cache")
    entry = _put(store, "k" * 64, {"saved_model.pb": b"same model"})
    publish(tmp_path / "out" / "alpha", _pairs(store, entry), _manifest("alpha", entry), None)
    publish(tmp_path / "out" / "beta", _pairs(store, entry), _manifest("beta", entry), None)
    alpha, beta = tmp_path / "out" / "alpha" / "1" / "saved_model.pb", tmp_path / "out" / "beta" / "1" / "saved_model.pb"
    obj = store.object_path(entry.files[0].hash)
    assert len({os.stat(p).st_ino for p in (alpha, beta, obj)}) == 3
    os.chmod(alpha, 0o644)
    with open(alpha, "r+b") as f:
        f.write(b"XX")
    assert alpha.read_bytes() == b"XXme model"
    assert beta.read_bytes() == obj.read_bytes() == b"same model"


def test_hardlink_mode_restores_a_damaged_output_in_place(tmp_path):
    store, cache = Store(tmp_path / "cache"), StatCache(None)
    entry = _put(store, "k" * 64, {"saved_model.pb": b"same model"})
    recipe_dir = tmp_path / "out" / "alpha"
    publish(recipe_dir, _pairs(store, entry), _manifest("alpha", entry), None, cache, link_type="hardlink")
    published = recipe_dir / "1" / "saved_model.pb"
    obj = store.object_path(entry.files[0].hash)
    assert os.stat(published).st_ino == os.stat(obj).st_ino
    time.sleep(0.15)  # past the racy window, so the stat cache would trust an unchanged stat
    assert newest_matching(recipe_dir, entry.tree, cache) == 1
    os.chmod(published, 0o644)
    with open(published, "r+b") as f:  # one inode: this damages the cache object too
        f.write(b"XX")
    assert newest_matching(recipe_dir, entry.tree, cache) is None  # detected (ctime changed)
    assert not store.verify(entry, cache)  # the build rebuilds the stage...
    rebuilt = _put(store, "k" * 64, {"saved_model.pb": b"same model"}, cache)
    holding = newest_holding(recipe_dir, entry.tree, cache)  # a query: what is damaged
    assert holding.number == 1 and holding.damaged == ("saved_model.pb",)
    restored = repair_newest(recipe_dir, holding, _pairs(store, rebuilt), cache, "hardlink")
    assert restored == [published]  # ...and the version is restored in place, not republished
    assert published.read_bytes() == b"same model" and sorted(os.listdir(recipe_dir)) == ["1"]


# --- issue 8.7: the stat cache -----------------------------------------------------------

def test_same_size_rewrite_with_a_fixed_mtime_on_the_same_inode_is_rehashed(tmp_path):
    path = tmp_path / "model.pb"
    path.write_bytes(b"version one")
    fixed = 1_600_000_000_000_000_000  # SOURCE_DATE_EPOCH-style fixed timestamp
    os.utime(path, ns=(fixed, fixed))
    time.sleep(0.15)  # past the racy window
    cache = StatCache(tmp_path / "statcache.json")
    assert cache.file_hash(str(path)) == hash_file(path)
    cache.save()
    inode = os.stat(path).st_ino
    with open(path, "r+b") as f:  # same inode, same size, same mtime afterwards
        f.write(b"VERSION TWO")
    os.utime(path, ns=(fixed, fixed))
    assert (os.stat(path).st_ino, os.stat(path).st_size, os.stat(path).st_mtime_ns) == (inode, 11, fixed)
    assert StatCache(tmp_path / "statcache.json").file_hash(str(path)) == hash_file(path)


def test_racy_window_covers_coarse_timestamps():
    from tpubuild.digests import is_racy

    second = 1_700_000_000 * 10**9
    # a file system with whole-second timestamps (FAT, ext3, HFS+): hashed 1.5 s after
    # its recorded change, a second write in that second would keep the same stat
    assert is_racy(second, second, second + 1_500_000_000)
    assert not is_racy(second, second, second + 2_100_000_000)
    # fine-grained timestamps: only the kernel's clock tick (<= 10 ms) is uncertain
    assert not is_racy(second + 123_456_789, second + 123_456_789, second + 300_000_000)
    assert is_racy(second + 123_456_789, second + 123_456_789, second + 150_000_000)


def test_entries_of_deleted_files_are_pruned(tmp_path):
    live = tmp_path / "live"
    live.write_text("x")
    time.sleep(0.15)
    path = tmp_path / "statcache.json"
    cache = StatCache(path)
    cache.file_hash(str(live))
    cache.entries.update({f"/gone/{i}": [1, i, 1, 1, 1, "0" * 64] for i in range(1000)})
    cache.save()
    assert list(json.loads(path.read_text())["entries"]) == [str(live)]


# --- issue 13.2: only what tpubuild published is deleted ---------------------------------

def test_prune_and_clean_leave_directories_tpubuild_did_not_publish(tmp_path):
    from tpubuild.publish import remove_published

    store = Store(tmp_path / "cache")
    recipe_dir = tmp_path / "out" / "toy"
    (recipe_dir / "1").mkdir(parents=True)
    (recipe_dir / "1" / "mine.txt").write_text("a user's file")
    for n in range(3):
        entry = _put(store, f"{n}" * 64, {"f": str(n).encode()})
        publish(recipe_dir, _pairs(store, entry), _manifest("toy", entry), None)
    (recipe_dir / "2" / "extra").write_text("added by hand")
    warnings: list[str] = []
    assert prune(recipe_dir, 1, warnings.append) == [3]
    assert warnings == [
        f"{recipe_dir / '1'}: no readable {MANIFEST}; left in place",
        f"{recipe_dir / '2'}: holds files its {MANIFEST} does not list (extra); left in place",
    ]
    removed, left = remove_published(recipe_dir, "toy")
    assert removed == [recipe_dir / "4"]
    assert [(p.name, why) for p, why in left] == [
        ("1", f"no readable {MANIFEST}"), ("2", f"holds files its {MANIFEST} does not list (extra)")]
    assert (recipe_dir / "1" / "mine.txt").exists() and (recipe_dir / "2" / "extra").exists()


def test_ingesting_a_source_model_replaces_a_damaged_object(tmp_path):
    from tpubuild.digests import FileEntry

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "saved_model.pb").write_bytes(b"the user's model")
    entry = FileEntry("saved_model.pb", hash_file(tmp_path / "src" / "saved_model.pb"), 16)
    Store(tmp_path / "cache").ingest_copies([entry], tmp_path / "src", StatCache(None))
    obj = Store(tmp_path / "cache").object_path(entry.hash)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"damaged in cache")
    Store(tmp_path / "cache").ingest_copies([entry], tmp_path / "src", StatCache(None))
    assert obj.read_bytes() == b"the user's model"
    assert os.stat(obj).st_ino != os.stat(tmp_path / "src" / "saved_model.pb").st_ino


def test_max_size_drops_least_recently_used_unreferenced_entries_only(tmp_path):
    ws = _workspace(tmp_path / "ws")
    store = Store(tmp_path / "shared-cache")
    for n, key in enumerate(("a" * 64, "b" * 64, "c" * 64)):
        _put(store, key, {"f": bytes([n]) * 1000})
        os.utime(store.entry_path(key), (1000 + n, 1000 + n))  # a: least recently used
    store.register_workspace(ws, {"a" * 64})
    store.close()
    result = collect(Store(tmp_path / "shared-cache"), set(), keep_days=None, max_size=2000)
    assert (result.entries_removed, result.bytes_kept) == (1, 2000)
    assert [store.has(k * 64) for k in "abc"] == [True, False, True]
