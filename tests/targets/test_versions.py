"""Target versions on disk (publish/versions.py, publish/targets.py), without TensorFlow:
publishing order and numbering, pruning and `clean` of the sibling versions, a killed
publish, and repair of a deleted target version."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tpubuild.digests import FileEntry, StatCache, hash_file
from tpubuild.publish import versions


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
    return versions.publish(recipe_dir, files, manifest, keep, StatCache(tmp_path / "stat.json"),
                            reservation=versions.reservation_file(tmp_path / "state", recipe_dir))


def test_each_version_has_its_target_version_and_pruning_removes_both(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    assert [publish(tmp_path, recipe_dir, t, keep=2) for t in (b"a", b"b", b"c")] == [1, 2, 3]
    assert sorted(os.listdir(recipe_dir)) == ["2", "3", "cpu_savedmodel"]
    assert sorted(os.listdir(recipe_dir / "cpu_savedmodel")) == ["2", "3"]
    assert (recipe_dir / "cpu_savedmodel" / "3" / "saved_model.pb").read_bytes() == b"cpuc"
    assert (recipe_dir / "cpu_savedmodel" / "3" / "variables" / "variables.index").read_bytes() == b"idxc"
    assert not (recipe_dir / "3" / "cpu_savedmodel").exists()  # beside the main version, not in it


def test_a_target_version_left_without_its_main_version_never_has_its_number_reused(tmp_path):
    # Issue 32: what an older tpubuild's killed publish left (targets were renamed first):
    # cpu_savedmodel/2 visible, no main 2. A model server may have loaded it: 2 is used.
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    orphan = recipe_dir / "cpu_savedmodel" / "2"
    shutil.copytree(recipe_dir / "cpu_savedmodel" / "1", orphan)
    manifest = json.loads((orphan / "tpubuild-manifest.json").read_text())
    os.chmod(orphan / "tpubuild-manifest.json", 0o644)
    (orphan / "tpubuild-manifest.json").write_text(json.dumps(dict(manifest, version=2)))
    versions.reservation_file(tmp_path / "state", recipe_dir).unlink()  # an older tpubuild kept none
    assert versions.version_numbers(recipe_dir) == [1]  # what a build trusts: the main versions
    assert publish(tmp_path, recipe_dir, b"b") == 3
    assert not orphan.exists()  # removed as an orphan, its number not given to other bytes
    assert (recipe_dir / "cpu_savedmodel" / "3" / "saved_model.pb").read_bytes() == b"cpub"


def test_a_reserved_number_is_never_reused_even_when_its_directories_are_gone(tmp_path):
    # A publish killed after reserving 2 and before (or after) renaming anything: 2 stays used.
    recipe_dir = tmp_path / "out" / "toy"
    assert [publish(tmp_path, recipe_dir, t) for t in (b"a", b"b")] == [1, 2]
    shutil.rmtree(recipe_dir / "cpu_savedmodel" / "2")
    shutil.rmtree(recipe_dir / "2")
    assert publish(tmp_path, recipe_dir, b"c") == 3
    assert versions.reservation_file(tmp_path / "state", recipe_dir).read_text().startswith("3\n")


def test_every_version_is_complete_before_the_main_one_is_renamed_into_place(tmp_path):
    # Every version, targets included, is written, checked and attested in a temp directory
    # before anything is renamed: none is visible while `finish` runs on any of them. (The
    # main version is then renamed first: test_a_publish_killed_between_main_and_target_...)
    recipe_dir = tmp_path / "out" / "toy"
    seen = []

    def finish(directory, manifest, target):
        seen.append((target, (recipe_dir / "1").is_dir(), (recipe_dir / "cpu_savedmodel" / "1").exists()))

    files = objects(tmp_path, {"saved_model.pb": b"tpu", "cpu_savedmodel/saved_model.pb": b"cpu"})
    manifest = {"recipe": "toy", "content": "a", "files": {"saved_model.pb": files[1][0].hash},
                "targets": {"cpu_savedmodel": {"files": {"saved_model.pb": files[0][0].hash}}}}
    assert versions.publish(recipe_dir, files, manifest, None, finish=finish) == 1
    assert seen == [(None, False, False), ("cpu_savedmodel", False, False)]
    assert (recipe_dir / "1").is_dir() and (recipe_dir / "cpu_savedmodel" / "1").is_dir()


def test_a_publish_killed_between_main_and_target_is_completed_whole(tmp_path):
    recipe_dir = tmp_path / "out" / "toy"
    publish(tmp_path, recipe_dir, b"a")
    shutil.rmtree(recipe_dir / "cpu_savedmodel" / "1")  # the main version's rename was the last one
    files = objects(tmp_path, {"saved_model.pb": b"tpua", "tpubuild-report.json": b"{}",
                               "cpu_savedmodel/saved_model.pb": b"cpua",
                               "cpu_savedmodel/variables/variables.index": b"idxa"})
    stat = StatCache(tmp_path / "stat.json")
    holding = versions.newest_holding(recipe_dir, "a", stat)
    assert holding.number == 1 and holding.stale == ("cpu_savedmodel",)
    assert versions.repair_newest(recipe_dir, holding, files, stat, "copy")
    assert versions.not_published_reason(recipe_dir / "cpu_savedmodel" / "1", "toy", "cpu_savedmodel") is None
    assert not [p for p in (recipe_dir / "cpu_savedmodel").iterdir() if p.name.startswith(".")]


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
    assert not list(recipe_dir.glob("cpu_savedmodel*"))  # and the query wrote nothing
    restored = versions.repair_newest(recipe_dir, versions.newest_holding(recipe_dir, "a", stat), files, stat, "copy")
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


def test_the_same_model_re_measured_updates_the_newest_version_in_place(tmp_path):
    # Issue 38 item 3: only the report differs; no new number, the model files untouched.
    import hashlib

    from tpubuild.provenance import statement
    from tpubuild.publish import check_manifest, update_version

    recipe_dir = tmp_path / "out" / "toy"

    def finish(directory, manifest, target):
        statement.write(directory, manifest, None, target)

    def build(content: str, report: dict[str, bytes]):
        (tmp_path / content).mkdir()
        files = objects(tmp_path / content, {"saved_model.pb": b"tpu", "cpu_savedmodel/saved_model.pb": b"cpu",
                                              **report})
        target = {f.path.split("/", 1)[1]: f.hash for f, _ in files if f.path.startswith("cpu_savedmodel/")}
        manifest = {"recipe": "toy", "recipe_file": "recipes/toy.yaml", "recipe_digest": "d", "content": content,
                    "model": "m", "created": content, "targets": {"cpu_savedmodel": {"files": target}},
                    "files": {f.path: f.hash for f, _ in files if not f.path.startswith("cpu_savedmodel/")}}
        return files, manifest

    first, manifest = build("c1", {"tpubuild-report.json": b"one", "hlo/a.txt": b"a"})
    assert versions.publish(recipe_dir, first, manifest, None, finish=finish) == 1
    model = [recipe_dir / "1" / "saved_model.pb", recipe_dir / "cpu_savedmodel" / "1" / "saved_model.pb"]
    inodes = [os.stat(p).st_ino for p in model]
    assert versions.newest_same_model(recipe_dir, "m") == 1
    assert versions.newest_same_model(recipe_dir, "another model") is None

    second, manifest = build("c2", {"tpubuild-report.json": b"two", "hlo/b.txt": b"b"})
    stat = StatCache(tmp_path / "stat.json")
    update_version(recipe_dir, 1, second, manifest, stat, finish=finish)
    assert sorted(os.listdir(recipe_dir)) == ["1", "cpu_savedmodel"]
    assert [os.stat(p).st_ino for p in model] == inodes  # never rewritten
    version = recipe_dir / "1"
    assert (version / "tpubuild-report.json").read_bytes() == b"two"
    assert sorted(os.listdir(version / "hlo")) == ["b.txt"]  # the old report's file is gone
    written = json.loads((version / "tpubuild-manifest.json").read_text())
    assert (written["content"], written["version"], written["created"]) == ("c2", 1, "c1")
    assert check_manifest(version) == []
    for directory, target in ((version, None), (recipe_dir / "cpu_savedmodel" / "1", "cpu_savedmodel")):
        assert versions.not_published_reason(directory, "toy", target) is None
        subjects = {s["name"]: s["digest"]["sha256"]
                    for s in json.loads((directory / "tpubuild-provenance.json").read_text())["subject"]}
        assert subjects == {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                            for p in directory.rglob("*") if p.is_file() and p.name != "tpubuild-provenance.json"}
    assert versions.newest_matching(recipe_dir, "c2", stat) == 1  # intact, target manifests current
    assert not [p for d in (recipe_dir, recipe_dir / "cpu_savedmodel") for p in d.iterdir() if p.name.startswith(".")]
