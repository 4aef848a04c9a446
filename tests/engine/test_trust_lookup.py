"""Issue 39: what a lookup reads from the cache is bound to its key (a dep file cannot send a
stage to another record), and publish verifies the bytes it wrote before the version appears.
Two real users (the second one needs root to be made) share a 2775 cache, umask 002."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import blake3
import pytest
import yaml

from tests.engine.conftest import CLI, REPO, build_json, export_recipe, statuses
from tpubuild.keys import stage_key

CO_USER, GROUP = 4302, 4300  # the co-user and the group the cache is shared with (no passwd entry needed)
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as a second uid needs root")


@pytest.fixture
def shared_dir():
    """A directory every user can reach (pytest's tmp dirs are 0700) holding `cache/`, made
    as docs/shared-cache.md says: group GROUP, mode 2775."""
    top = Path(tempfile.mkdtemp(prefix="tpubuild-shared-"))
    os.chmod(top, 0o755)
    cache = top / "cache"
    cache.mkdir()
    if os.geteuid() == 0:
        os.chown(cache, -1, GROUP)
    os.chmod(cache, 0o2775)
    yield cache
    shutil.rmtree(top, ignore_errors=True)


def build_shared(ws: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """`tpubuild build --json` as this user with umask 002 (a cache shared by a group)."""
    result = subprocess.run([*CLI, "build", "--json", *args], cwd=ws, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, umask=0o002)
    assert result.returncode == expect, result.stderr
    return result


def as_co_user(*command: str) -> None:
    """Run `command` as the co-user, a member of the cache's group, umask 002."""
    result = subprocess.run(list(command), user=CO_USER, group=GROUP, extra_groups=[GROUP], umask=0o002,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _lock_keys(ws: Path, recipe: str) -> dict[str, str]:
    lock = yaml.safe_load((ws / "recipes" / f"{recipe}.lock.yaml").read_text())
    return {stage["stage"]: stage["key"] for stage in lock["stages"]}


def _dep_file(cache: Path, final_key: str) -> tuple[Path, list]:
    """The dep file that leads from a user-code stage's declared key to `final_key`, and its candidates."""
    record = json.loads((cache / "v1" / "stages" / final_key[:2] / f"{final_key}.json").read_text())
    declared = stage_key({k: v for k, v in record["record"].items() if k != "discovered"})
    path = cache / "v1" / "discovered" / declared[:2] / f"{declared}.json"
    return path, json.loads(path.read_text())


def _stale_export_setup(ws: Path, cache: Path, build) -> tuple[Path, str, str]:
    """`cut` built with note "first", then with note "second": (its export's dep file, and
    its candidate for the current files pointed at the first export's key), old key, new key."""
    build(ws)
    old = _lock_keys(ws, "cut")["export"]
    notes = ws / "recipes" / "models" / "notes.py"
    notes.write_text(notes.read_text().replace('"first"', '"second"'))
    build(ws)
    new = _lock_keys(ws, "cut")["export"]
    assert new != old
    path, candidates = _dep_file(cache, new)
    newest = next(c for c in candidates if c["key"] == new)
    return path, json.dumps([{"files": newest["files"], "key": old}]), new


def _assert_current_export_published(ws: Path, result: subprocess.CompletedProcess, dep: Path, new: str) -> None:
    assert _lock_keys(ws, "cut")["export"] == new
    assert statuses(json.loads(result.stdout), "cut")["export"] == "built"
    versions = sorted(int(p.name) for p in (ws / "out" / "cut").iterdir() if p.name.isdigit())
    assert versions == [1, 2]  # the rebuilt export is the one already published: no version of the old one
    assert (ws / "out" / "cut" / "2" / "assets" / "note.txt").read_text() == "second"
    warnings = [line for line in result.stderr.splitlines() if "dep file" in line]
    assert warnings == [f"warning: cache dep file {dep}: 1 candidate(s) whose key is not the final key of their "
                        "files (not written by tpubuild); ignored"], result.stderr


@pytest.mark.slow
@NEEDS_ROOT
def test_a_co_user_cannot_send_an_export_lookup_to_an_older_record(make_workspace, shared_dir):
    # Before: the dep file's `key` was used as written; a co-user pointed the candidate that
    # matches today's files at the victim's older export (a valid record, MACed by the
    # victim), and the build said export: cached and published the old model.
    ws = make_workspace({"cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"cache_dir: {shared_dir}\n")
    dep, forged, new = _stale_export_setup(ws, shared_dir, build_shared)
    assert os.stat(dep.parent).st_gid == GROUP and os.stat(dep.parent).st_mode & 0o020  # the co-user may write here
    as_co_user("/bin/sh", "-c", 'printf %s "$2" > "$1.new" && mv -f "$1.new" "$1"', "sh", str(dep), forged)
    assert os.stat(dep).st_uid == CO_USER
    result = build_shared(ws)
    _assert_current_export_published(ws, result, dep, new)
    # The stage's build rewrote the dep file with the candidates that check, its own among them.
    assert [c["key"] for c in json.loads(dep.read_text())] == [new]


@pytest.mark.slow
def test_a_dep_file_edited_or_replaced_by_a_link_redirects_no_lookup(built_workspace, tmp_path):
    ws = built_workspace
    cache = ws / ".tpubuild" / "cache"
    dep, forged, new = _stale_export_setup(ws, cache, build_json)
    dep.write_text(forged)
    result = subprocess.run([*CLI, "build", "--json"], cwd=ws, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    _assert_current_export_published(ws, result, dep, new)
    # A link in its place is not followed (its target, the user's file, is left alone) nor read.
    elsewhere = tmp_path / "mine.json"
    elsewhere.write_text(forged)
    dep.unlink()
    dep.symlink_to(elsewhere)
    result = subprocess.run([*CLI, "build", "--json", "cut"], cwd=ws, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert f"warning: cache dep file {dep}: not a regular file; ignored" in result.stderr.splitlines()
    assert statuses(json.loads(result.stdout), "cut")["export"] == "built"
    assert elsewhere.read_text() == forged and not dep.is_symlink()
    assert _lock_keys(ws, "cut")["export"] == new


def _swap(path: Path, content: str, co_user: bool) -> None:
    """Rename a file holding `content` over `path` (a cache object in a group-writable shard)."""
    command = ["/bin/sh", "-c", 'printf %s "$2" > "$1.new" && mv -f "$1.new" "$1"', "sh", str(path), content]
    if co_user:
        as_co_user(*command)
    else:
        subprocess.run(command, check=True, timeout=60)


@pytest.mark.slow
def test_publish_refuses_an_object_changed_between_its_check_and_its_copy(make_workspace, shared_dir):
    # Before: publish copied each object without hashing the copy; an object swapped after
    # the export's lookup checked it (during verify) was published and attested (EVIL).
    # With root the swap is a co-user's (a second uid of the cache's group), else this user's.
    ws = make_workspace({"cut": export_recipe("cut", "models/copy_export.py", "models/notes.py")})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"cache_dir: {shared_dir}\n")
    build = subprocess.Popen([*CLI, "build", "--json"], cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, umask=0o002)
    obj = None
    while obj is None and build.poll() is None:  # the export's record: its objects were checked
        for record in (shared_dir / "v1" / "stages").glob("*/*.json"):
            data = json.loads(record.read_text())
            if data["stage"] == "export":
                digest = next(h for p, h, _ in data["files"] if p == "assets/note.txt")
                obj = shared_dir / "v1" / "objects" / digest[:2] / digest[2:]
        time.sleep(0.01)
    assert obj is not None, build.communicate()
    _swap(obj, "EVIL", co_user=os.geteuid() == 0)
    out, err = build.communicate(timeout=300)
    assert build.returncode == 1, err
    assert statuses(json.loads(out), "cut")["publish"] == "failed"
    errors = [line for line in err.splitlines() if "publish" in line]
    assert errors == [f"recipes/cut.yaml: stage publish: cache object {obj} changed after it was checked (what was "
                      f"read from it hashes {blake3.blake3(b'EVIL').hexdigest()[:16]}, not {digest[:16]}); nothing "
                      "published, build again"], err
    assert not [p for p in (ws / "out" / "cut").iterdir()]  # nothing published, no temp directory left
    # The next build finds the object damaged, rebuilds the export and publishes it.
    document = build_json(ws)
    assert statuses(document, "cut")["export"] == "built"
    published = [p for p in (ws / "out" / "cut").iterdir()]
    assert len(published) == 1 and (published[0] / "assets" / "note.txt").read_text() == "first"


@pytest.mark.parametrize("link_type", ["copy", "hardlink"])
def test_every_published_file_is_checked_before_any_version_appears(tmp_path, link_type):
    # Objects that changed after their check: one in a target version, one in a restore.
    from tpubuild.digests import FileEntry, hash_file
    from tpubuild.errors import StageError
    from tpubuild.publish import versions

    objects = tmp_path / "objects"
    objects.mkdir()
    pairs = []
    for rel, content in (("saved_model.pb", b"model"), ("cpu_savedmodel/saved_model.pb", b"cpu model")):
        obj = objects / rel.replace("/", "-")
        obj.write_bytes(content)
        os.chmod(obj, 0o444)
        pairs.append((FileEntry(rel, hash_file(obj), len(content)), obj))
    manifest = {"recipe": "r", "content": "c", "files": {"saved_model.pb": pairs[0][0].hash},
                "targets": {"cpu_savedmodel": {"files": {"saved_model.pb": pairs[1][0].hash}}}}
    recipe_dir, reserved = tmp_path / "out" / "r", tmp_path / "reserved"  # number 1 stays used
    changed = pairs[1][1]
    os.chmod(changed, 0o644)
    changed.write_bytes(b"EVIL model")
    with pytest.raises(StageError, match=f"cache object {changed} changed after it was checked"):
        versions.publish(recipe_dir, pairs, manifest, None, link_type=link_type, reservation=reserved)
    assert sorted(os.listdir(recipe_dir)) == ["cpu_savedmodel"] and not os.listdir(recipe_dir / "cpu_savedmodel")
    changed.write_bytes(b"cpu model")
    assert versions.publish(recipe_dir, pairs, manifest, None, link_type=link_type, reservation=reserved) == 2
    published = recipe_dir / "2" / "saved_model.pb"
    assert published.read_bytes() == b"model"
    assert (recipe_dir / "cpu_savedmodel" / "2" / "saved_model.pb").read_bytes() == b"cpu model"
    # A damaged published file is restored only with bytes that hash as its manifest says.
    os.chmod(published, 0o644) if link_type == "copy" else published.unlink()
    published.write_bytes(b"damaged")
    os.chmod(pairs[0][1], 0o644)
    pairs[0][1].write_bytes(b"EVIL")
    restored, lost = versions.repair_version(recipe_dir / "2", lambda digest: pairs[0][1], link_type)
    assert (restored, lost) == ([], [published]) and published.read_bytes() == b"damaged"


def test_an_upload_signs_the_record_the_build_made_not_the_file_under_its_name(tmp_path):
    # The upload read the local record file back and signed those bytes: a co-user who
    # replaced it (the stages/ shard of a shared cache is group-writable) between the
    # build's write and the upload had this builder vouch for their files under its key.
    from cryptography.hazmat.primitives.asymmetric import ec

    from tpubuild.digests import StatCache, key_id
    from tpubuild.remote import RemoteCache, push_entry
    from tpubuild.store import Store

    store = Store(tmp_path / "cache")
    outputs = {}
    for name, key in (("mine", "a" * 64), ("theirs", "b" * 64)):
        work = store.new_workdir(name)
        (Path(work) / "model.bin").write_text(name)
        outputs[name] = store.put(key, "export", Path(work), {}, [], {"stage": name}, StatCache(None))
    mine = outputs["mine"]
    theirs = json.loads(store.entry_path(outputs["theirs"].key).read_text())
    theirs["key"] = mine.key
    store.entry_path(mine.key).write_text(json.dumps(theirs))
    key = ec.generate_private_key(ec.SECP256R1())
    remote = RemoteCache(f"file://{tmp_path / 'remote'}", signing_key=key)
    remote.connect()
    assert push_entry(remote, mine, store)
    signed = tmp_path / "remote" / "v1" / "signed" / key_id(key.public_key()) / mine.key[:2] / f"{mine.key}.json"
    for path in (signed, tmp_path / "remote" / "v1" / "stages" / mine.key[:2] / f"{mine.key}.json"):
        document = json.loads(path.read_text())
        record = json.loads(document["record"]) if "signature" in document else document
        assert (record["key"], record["files"]) == (mine.key, [[f.path, f.hash, f.size] for f in mine.files]), path
    store.close()


@pytest.mark.slow
def test_a_link_in_place_of_a_dep_file_directory_is_removed_never_written_through(built_workspace, tmp_path):
    # Before: engine/resolver.py read and wrote dep files by path (write_text_atomic), so a
    # link in place of `discovered/ab` had the build read and replace the files of the
    # directory it points to. The store owns them now (store/depfiles.py): every directory
    # opened without following a link, a link there is damage, removed, its target left alone.
    ws = built_workspace
    cache = ws / ".tpubuild" / "cache"
    dep, _, new = _stale_export_setup(ws, cache, build_json)
    shard = dep.parent
    elsewhere = tmp_path / "theirs"
    shutil.copytree(shard, elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    shutil.rmtree(shard)
    shard.symlink_to(elsewhere, target_is_directory=True)
    (cache / "v1" / "stages" / new[:2] / f"{new}.json").unlink()  # the export runs again: its dep file is read, then written
    result = subprocess.run([*CLI, "build", "--json", "cut"], cwd=ws, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [
        f"warning: cache {shard} is a symbolic link, not what tpubuild keeps there; removed (the link itself, not "
        "what it points to)"]
    assert statuses(json.loads(result.stdout), "cut")["export"] == "built"
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before
    assert not shard.is_symlink() and shard.is_dir()
    assert _lock_keys(ws, "cut")["export"] == new
    assert [c["key"] for c in _dep_file(cache, new)[1]] == [new]  # written afresh in a directory of the cache's
