"""Issue 32: a shared cache no co-user can poison, objects that are regular files, version
numbers never reused, the layout validated, version names, provenance for standard tools."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import build_json, lock_record, source_recipe, statuses


@pytest.mark.slow
def test_only_ascii_digit_directories_are_versions(built_workspace):
    # `²` and `١` pass str.isdigit(); int() refuses the first and reads the second as 1.
    # Both are the user's directories: left alone, never a version, never a crash.
    ws = built_workspace
    for name in ("²", "١", "01"):
        (ws / "out" / "toy" / name).mkdir()
    (ws / "out" / "toy" / "١" / "keep.txt").write_text("mine")
    result = tpubuild(ws, "build", "--check")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = build_json(ws, "toy")
    assert [r["status"] for r in document["rows"] if r["stage"] == "publish"] == ["cached"]
    (ws / "recipes" / "toy.yaml").write_text((ws / "recipes" / "toy.yaml").read_text().replace("samples: 4", "samples: 3"))
    build_json(ws, "toy")
    assert {p.name for p in (ws / "out" / "toy").iterdir() if not p.name.startswith(".")} == \
        {"01", "1", "2", "١", "²"}
    assert (ws / "out" / "toy" / "١" / "keep.txt").read_text() == "mine"
    result = tpubuild(ws, "clean", "toy")
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (ws / "out" / "toy").iterdir()} == {"01", "١", "²"}


def test_output_dir_cache_dir_and_recipe_tree_must_not_contain_one_another(make_workspace):
    # Issue 32's reproduction: output_dir inside the cache, a recipe named `tmp`: the next
    # build's temp-session cleanup deleted published version 1.
    ws = make_workspace({"tmp": source_recipe("tmp")})
    cases = {
        "output_dir: .tpubuild/cache/v1\n":
            "tpubuild.yaml:2:13: output_dir: output_dir '.tpubuild/cache/v1' is inside cache_dir '.tpubuild/cache'",
        "cache_dir: out/cache\n": "tpubuild.yaml:2:12: cache_dir: cache_dir 'out/cache' is inside output_dir 'out'",
        "output_dir: recipes\n":
            "tpubuild.yaml:2:13: output_dir: output_dir 'recipes' is the same directory as the recipe tree of "
            "'recipes/*.yaml'",
        "output_dir: build\ncache_dir: build\n":
            "tpubuild.yaml:2:13: output_dir: output_dir 'build' is the same directory as cache_dir 'build'",
    }
    descending = 'recipes: ["recipes/**/*.yaml"]\noutput_dir: recipes/out\n'  # a glob that would read out/
    cases[descending] = "tpubuild.yaml:2:13: output_dir: output_dir 'recipes/out' is inside the recipe tree of " \
        "'recipes/**/*.yaml'"
    for text, expected in cases.items():
        (ws / "tpubuild.yaml").write_text(text if text.startswith("recipes:") else 'recipes: ["recipes/*.yaml"]\n' + text)
        for command in (["validate"], ["build", "--dry-run"], ["list"]):
            result = tpubuild(ws, *command)
            assert result.returncode == 2, (command, result.stderr)
            assert result.stderr.splitlines()[0].startswith(expected), result.stderr
            assert "Traceback" not in result.stderr
    assert not (ws / "out").exists() and not (ws / "build").exists()
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\noutput_dir: build/out\ncache_dir: build/cache\n')
    assert tpubuild(ws, "validate").returncode == 0


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_provenance_names_inputs_by_sha256_and_covers_the_manifest(built_once):
    # in-toto DigestSet consumers ignore algorithms they do not know (BLAKE3 has no
    # standard key): each dependency also carries sha256 (a file) or dirHash (a directory,
    # the spec's: sha256 over `sha256sum` lines sorted by path), and the manifest is a subject.
    ws, _ = built_once
    models = ws / "recipes" / "models"
    tiny = models / "tiny"
    tiny_files = sorted((p.relative_to(tiny).as_posix(), _sha256(p)) for p in tiny.rglob("*") if p.is_file())
    tiny_hash = hashlib.sha256("".join(f"{digest}  {rel}\n" for rel, digest in tiny_files).encode()).hexdigest()
    for recipe in ("cut", "toy"):
        version = ws / "out" / recipe / "1"
        statement = json.loads((version / "tpubuild-provenance.json").read_text())
        dependencies = {d["name"]: d["digest"] for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
        manifest = json.loads((version / "tpubuild-manifest.json").read_text())
        assert set(dependencies) == set(manifest["inputs"]) and dependencies
        for name, digests in dependencies.items():
            kind, _, rel = name.partition(":")
            standard = {"dirHash": tiny_hash} if kind == "dir" else {"sha256": _sha256(ws / rel)}
            assert digests == {"blake3": manifest["inputs"][name], **standard}, name
        subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
        assert subjects["tpubuild-manifest.json"] == _sha256(version / "tpubuild-manifest.json")


def _published_object(ws, recipe: str = "toy", rel: str = "saved_model.pb"):
    """The cache object of a published file of `recipe`'s version 1."""
    digest = json.loads((ws / "out" / recipe / "1" / "tpubuild-manifest.json").read_text())["files"][rel]
    return ws / ".tpubuild" / "cache" / "v1" / "objects" / digest[:2] / digest[2:]


def _rebuild_toy(ws, tmp_path, timeout: float = 300) -> tuple[dict, list[str]]:
    """Build toy again from its cache (its published versions moved aside)."""
    (ws / "out" / "toy").rename(tmp_path / "toy-aside")
    result = tpubuild(ws, "build", "--json", "toy", timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), [line for line in result.stderr.splitlines() if "cache object" in line]


@pytest.mark.slow
def test_a_cache_object_replaced_by_a_symlink_is_removed_and_never_linked_through(built_workspace, tmp_path):
    # With link_type: hardlink, os.link on a symlink links the symlink: the published file
    # would be a link to a file its owner can change after the build.
    ws = built_workspace
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write("link_type: hardlink\n")
    obj = _published_object(ws)
    theirs = tmp_path / "theirs.pb"
    theirs.write_bytes(obj.read_bytes())  # the right content: its hash checks out
    os.unlink(obj)
    os.symlink(theirs, obj)
    document, warnings = _rebuild_toy(ws, tmp_path)
    assert len(warnings) == 1 and warnings[0].endswith(f"cache object {obj} is a symbolic link; removed, its stage "
                                                       "rebuilds"), warnings
    published = ws / "out" / "toy" / "1" / "saved_model.pb"
    assert not published.is_symlink() and os.stat(published).st_ino != os.stat(theirs).st_ino
    assert not obj.is_symlink() and obj.is_file()
    theirs.write_bytes(b"their later edit")
    assert published.read_bytes() == obj.read_bytes() != b"their later edit"
    assert "built" in [r["status"] for r in document["rows"] if r["recipe"] == "toy"]


@pytest.mark.slow
def test_a_fifo_in_the_cache_objects_is_removed_not_read(built_workspace, tmp_path):
    ws = built_workspace
    obj = _published_object(ws)
    os.unlink(obj)
    os.mkfifo(obj)  # reading it would block the build forever
    _, warnings = _rebuild_toy(ws, tmp_path, timeout=120)
    assert len(warnings) == 1 and "is a FIFO (named pipe); removed" in warnings[0], warnings
    assert obj.is_file()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_object_is_damage_in_a_private_cache_and_copied_in_a_shared_one(built_workspace, tmp_path):
    ws = built_workspace
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write("link_type: hardlink\n")
    obj = _published_object(ws)
    os.chown(obj, 4242, 4242, follow_symlinks=False)
    _, warnings = _rebuild_toy(ws, tmp_path)
    assert len(warnings) == 1 and f"is owned by uid 4242, in a cache only uid {os.getuid()} can write" in warnings[0]
    assert os.stat(obj).st_uid == os.getuid()
    # A shared cache (group-writable): another user's object is used, but only copied.
    for directory in (ws / ".tpubuild" / "cache" / "v1", ws / ".tpubuild" / "cache" / "v1" / "objects"):
        os.chmod(directory, 0o2775)
    os.chown(obj, 4242, 4242)
    (ws / "out" / "toy").rename(tmp_path / "toy-aside-2")
    result = tpubuild(ws, "build", "--json", "toy")
    assert result.returncode == 0, result.stderr
    assert "cache object" not in result.stderr
    published = ws / "out" / "toy" / "2" / "saved_model.pb"  # 1 was used in this directory already
    assert os.stat(published).st_ino != os.stat(obj).st_ino and published.read_bytes() == obj.read_bytes()


def _their_export_record(ws, tmp_path):
    """A co-user rewrites `cut`'s export record (same key, same path) to list their own
    export output, whose objects they put in the cache with correct hashes."""
    from tpubuild.digests import FileEntry, hash_file, tree_digest

    record = lock_record(ws, "cut")
    data = json.loads(record.read_text())
    theirs = tmp_path / "their-note"
    theirs.write_text("their model")
    digest = hash_file(theirs)
    obj = ws / ".tpubuild" / "cache" / "v1" / "objects" / digest[:2] / digest[2:]
    obj.parent.mkdir(exist_ok=True)
    obj.write_bytes(theirs.read_bytes())
    os.chmod(obj, 0o444)
    data["files"] = [[p, digest, 11] if p == "assets/note.txt" else [p, h, n] for p, h, n in data["files"]]
    data["tree"] = tree_digest([FileEntry(*f) for f in data["files"]])
    os.chmod(record, 0o644)
    record.write_text(json.dumps(data, sort_keys=True))
    return record


def test_a_stage_record_rewritten_by_a_co_user_is_ignored_and_rebuilt(built_workspace, tmp_path):
    ws = built_workspace
    record = _their_export_record(ws, tmp_path)
    result = tpubuild(ws, "build", "--json", "cut")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "cache record" in line]
    assert warnings == [f"warning: cache record {record} was not written by your tpubuild (its MAC does not verify "
                        f"with your key {ws}/.tpubuild/cache/v1/keys/{os.getuid()}); ignored, the stage rebuilds"]
    assert statuses(json.loads(result.stdout), "cut")["export"] == "built"
    # The rebuilt export is the same as before: nothing new is published, nothing of theirs.
    assert sorted(p.name for p in (ws / "out" / "cut").iterdir()) == ["1"]
    assert (ws / "out" / "cut" / "1" / "assets" / "note.txt").read_text() == "first"
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 0, check.stderr


def test_records_are_reused_by_another_workspace_of_the_same_user_sharing_the_cache(built_workspace, tmp_path):
    # The documented setup: two workspaces of one user, one cache_dir. The MAC key is the
    # user's (cache/v1/keys/<uid>, mode 0600): their records verify, nothing is rebuilt.
    ws = built_workspace
    key = ws / ".tpubuild" / "cache" / "v1" / "keys" / str(os.getuid())
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"
    other = tmp_path / "other"
    shutil.copytree(ws / "recipes", other / "recipes", ignore=shutil.ignore_patterns("*.lock.yaml"))
    (other / "tpubuild.yaml").write_text((ws / "tpubuild.yaml").read_text() + f"cache_dir: {ws / '.tpubuild' / 'cache'}\n")
    result = tpubuild(other, "build", "--json", "toy", "cut")
    assert result.returncode == 0, result.stderr
    assert "cache record" not in result.stderr
    for recipe in ("toy", "cut"):
        rows = statuses(json.loads(result.stdout), recipe)
        assert {stage for stage, status in rows.items() if status != "cached"} == {"publish"}, rows
