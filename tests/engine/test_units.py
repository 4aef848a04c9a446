"""The engine's parts on real files: hashes, stat cache, store, versions."""

from __future__ import annotations

import os

import blake3

from tpubuild.digests import StatCache, hash_file
from tpubuild.publish import MANIFEST, publish, version_numbers
from tpubuild.store import Store


def test_file_hash_is_blake3_for_small_and_threaded_sizes(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"abc")
    big.write_bytes(os.urandom(5 << 20))
    assert hash_file(small) == blake3.blake3(b"abc").hexdigest()
    assert hash_file(big) == blake3.blake3(big.read_bytes()).hexdigest()


def test_tree_hash_covers_paths_and_contents(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "sub" / "x").write_text("1")
    cache = StatCache(None)
    first, entries = cache.tree(tmp_path / "a")
    assert [e.path for e in entries] == ["sub/x"]
    (tmp_path / "a" / "sub" / "x").rename(tmp_path / "a" / "sub" / "y")
    renamed, _ = cache.tree(tmp_path / "a")
    (tmp_path / "a" / "sub" / "y").write_text("2")
    edited, _ = cache.tree(tmp_path / "a")
    assert len({first, renamed, edited}) == 3


def test_store_put_checkout_and_corruption(tmp_path):
    store, cache = Store(tmp_path / "cache"), StatCache(None)
    out = store.new_workdir("stage") / "out"
    out.mkdir()
    (out / "saved_model.pb").write_bytes(b"model")
    entry = store.put("k" * 64, "stage", out, {"n": 1}, [], {"stage": "stage"}, cache)
    assert store.get("k" * 64).files == entry.files
    checkout = store.checkout(entry)
    assert (checkout / "saved_model.pb").read_bytes() == b"model"
    assert os.stat(checkout / "saved_model.pb").st_mode & 0o777 == 0o444
    assert store.verify(entry, cache)
    obj = store.object_path(entry.files[0].hash)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"evil!")
    assert not store.verify(entry, cache)
    assert not obj.exists()


def test_publish_numbers_versions_and_prunes(tmp_path):
    store, cache = Store(tmp_path / "cache"), StatCache(None)
    recipe_dir = tmp_path / "out" / "toy"
    for n in range(4):
        out = store.new_workdir("s") / "out"
        out.mkdir()
        (out / "f").write_text(str(n))
        entry = store.put(f"{n}" * 64, "s", out, {}, [], {}, cache)
        files = [(f, store.object_path(f.hash)) for f in entry.files]
        manifest = {"recipe": "toy", "content": entry.tree, "files": {f.path: f.hash for f in entry.files}}
        assert publish(recipe_dir, files, manifest, keep=2) == n + 1
    assert version_numbers(recipe_dir) == [3, 4]
    assert sorted(os.listdir(recipe_dir)) == ["3", "4"]
    assert (recipe_dir / "4" / "f").read_text() == "3"
    assert sorted(os.listdir(recipe_dir / "4")) == ["f", MANIFEST]


def test_a_missing_stage_module_is_a_stage_error_not_a_crash(tmp_path):
    from tpubuild.workers import handle

    reply = handle({
        "entry": "tpubuild.stages.no_such_stage:run", "stage": "no_such_stage", "recipe": "toy",
        "recipe_file": str(tmp_path / "toy.yaml"), "workspace": str(tmp_path), "input_dir": str(tmp_path),
        "output_dir": str(tmp_path), "options": {}, "inputs": {}, "results": {},
    })
    assert reply == {"ok": False, "error": "stage module tpubuild.stages.no_such_stage does not exist in this tpubuild"}


def test_key_record_differences_name_list_items_by_path():
    """explain's causes: an item of a list of mappings by its path (`[0].field`), an item added
    or removed whole, a list of scalars whole (short, and clearer than index by index)."""
    from tpubuild.keys import diff_records

    old = {"options": {"batch_options": [{"timeout": 2000, "sizes": [2, 4, 8]}], "tpu": [{"alias": "a"}]}}
    new = {"options": {"batch_options": [{"timeout": 3000, "sizes": [2, 4]}], "tpu": [{"alias": "a"}, {"alias": "b"}]}}
    assert diff_records(old, new) == [
        "option batch_options[0].sizes: [2,4,8] -> [2,4]",
        "option batch_options[0].timeout: 2000 -> 3000",
        'option tpu[1]: added ({"alias":"b"})',
    ]
    assert diff_records(new, old)[-1] == 'option tpu[1]: removed (was {"alias":"b"})'
