"""Target versions on disk (engine/versions.py, engine/target_versions.py), without TensorFlow:
publishing order and numbering, pruning and `clean` of the sibling versions, a killed
publish, and repair of a deleted target version."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tpubuild.engine import versions
from tpubuild.engine.hashing import FileEntry, hash_file
from tpubuild.engine.statcache import StatCache


def objects(tmp_path: Path, contents: dict[str, bytes]) -> list[tuple[FileEntry, Path]]:
    """(entry, object path) pairs as the store hands them to publish."""
    store = tmp_path / "objects"
    store.mkdir(exist_ok=True)
    pairs = []
    for name, data in sorted(contents.items()):
        obj = store / name.replace("/", "_")
        obj.write_bytes(data)
        pairs.append((FileEntry(name, hash_file(obj), len(data)), obj))
    return pairs


def publish(tmp_path: Path, recipe_dir: Path, tag: bytes, keep: int | None = None) -> int:
    files = objects(tmp_path, {"saved_model.pb": b"tpu" + tag, "tpubuild-report.json": b"{}",
                               "cpu_savedmodel/saved_model.pb": b"cpu" + tag,
                               "cpu_savedmodel/variables/variables.index": b"idx" + tag})
    main = {f.path: f.hash for f, _ in files if not f.path.startswith("cpu_savedmodel/")}
    target = {f.path.split("/", 1)[1]: f.hash for f, _ in files if f.path.startswith("cpu_savedmodel/")}
    manifest = {"recipe": recipe_dir.name, "content": tag.decode(), "files": main,
                "targets": {"cpu_savedmodel": {"files": target}}}
    return versions.publish(recipe_dir, files, manifest, keep, StatCache(tmp_path / "stat.json"))


def test_each_version_has_its_target_version_and_pruning_removes_both(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    assert [publish(tmp_path, recipe_dir, t, keep=2) for t in (b"a", b"b", b"c")] == [1, 2, 3]
    assert sorted(os.listdir(recipe_dir)) == ["2", "3", "cpu_savedmodel"]
    assert sorted(os.listdir(recipe_dir / "cpu_savedmodel")) == ["2", "3"]
    assert (recipe_dir / "cpu_savedmodel" / "3" / "saved_model.pb").read_bytes() == b"cpuc"
    assert (recipe_dir / "cpu_savedmodel" / "3" / "variables" / "variables.index").read_bytes() == b"idxc"
    assert not (recipe_dir / "3" / "cpu_savedmodel").exists()  # beside the main version, not in it


def test_a_killed_publish_leaves_nothing_a_build_trusts_and_the_next_publish_removes_it(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    # A publish killed after its target version and before its main version.
    orphan = recipe_dir / "cpu_savedmodel" / "2"
    os.rename(recipe_dir / "cpu_savedmodel" / "1", orphan)
    (recipe_dir / "cpu_savedmodel" / "1").mkdir()
    for path in orphan.rglob("*"):
        if path.is_file():
            target = recipe_dir / "cpu_savedmodel" / "1" / path.relative_to(orphan)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    manifest = json.loads((orphan / "tpubuild-manifest.json").read_text())
    (orphan / "tpubuild-manifest.json").write_text(json.dumps(dict(manifest, version=2)))
    assert versions.version_numbers(recipe_dir) == [1]  # what a build trusts: the main versions
    assert publish(tmp_path, recipe_dir, b"b") == 2
    assert json.loads((orphan / "tpubuild-manifest.json").read_text())["content"] == "b"


def test_clean_removes_target_versions_and_leaves_what_is_not_tpubuilds(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    publish(tmp_path, recipe_dir, b"b")
    user_file = recipe_dir / "cpu_savedmodel" / "2" / "notes.txt"
    os.chmod(user_file.parent, 0o755)
    user_file.write_text("mine")
    removed, left = versions.remove_published(recipe_dir, "toy")
    assert sorted(p.relative_to(recipe_dir).as_posix() for p in removed) == ["1", "2", "cpu_savedmodel/1"]
    assert [(p.relative_to(recipe_dir).as_posix(), why) for p, why in left] == [
        ("cpu_savedmodel/2", "holds files its tpubuild-manifest.json does not list (notes.txt)")]
    assert user_file.read_text() == "mine"


def test_a_deleted_target_version_is_restored_in_place(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    files = objects(tmp_path, {"saved_model.pb": b"tpua", "tpubuild-report.json": b"{}",
                               "cpu_savedmodel/saved_model.pb": b"cpua",
                               "cpu_savedmodel/variables/variables.index": b"idxa"})
    import shutil

    shutil.rmtree(recipe_dir / "cpu_savedmodel")
    stat = StatCache(tmp_path / "stat.json")
    assert versions.newest_matching(recipe_dir, "a", stat) is None  # planning: not intact
    restored: list[Path] = []
    assert versions.newest_matching(recipe_dir, "a", stat, files, "copy", restored) == 1
    assert sorted(p.relative_to(recipe_dir).as_posix() for p in restored) == [
        "cpu_savedmodel/1/saved_model.pb", "cpu_savedmodel/1/tpubuild-manifest.json",
        "cpu_savedmodel/1/variables/variables.index"]
    assert versions.not_published_reason(recipe_dir / "cpu_savedmodel" / "1", "toy", "cpu_savedmodel") is None


def test_verify_cache_repair_covers_target_files(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    damaged = recipe_dir / "cpu_savedmodel" / "1" / "saved_model.pb"
    os.chmod(damaged, 0o644)
    damaged.write_bytes(b"garbage")
    store = {hash_file(p): p for p in (tmp_path / "objects").iterdir()}
    restored, lost = versions.repair_version(recipe_dir / "1", lambda digest: store.get(digest, tmp_path / "none"))
    assert (restored, lost) == ([damaged], [])
    assert damaged.read_bytes() == b"cpua"
