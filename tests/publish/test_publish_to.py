"""Issue 41 through the CLI, as a user meets it: `publish_to:` in tpubuild.yaml (a recipe's
own overriding it), a fresh CI clone numbering after what the destination holds, pruning
and `clean --remote`, `serving-config`, an unreachable destination, a build killed in its
publish, signed versions verified from the bucket. Against moto's S3 server on 127.0.0.1
and a file:// mount in tmp_path.

Two models of one recipe are built once per session (`warm`); each test copies that
workspace (its cache, not its outputs nor its notes) and so builds either model with
no TensorFlow: only the publish runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli import REPO, tpubuild
from tests.engine.conftest import (
    source_recipe,
    tiny_saved_model,  # noqa: F401 (a session fixture)
    write_workspace,
)
from tests.provenance.test_signed_versions import key_pair
from tests.remote.conftest import BUCKET
from tests.remote.places import MANIFEST, Place, file_place, s3_place

# Two models of `toy`: another batch timeout is another converted model (and manifest model).
MODELS = {"a": source_recipe("toy"), "b": source_recipe("toy", timeout=300)}


def recipe(model: str, name: str = "toy", extra: str = "") -> str:
    """MODELS[model] named `name` (the same stages: cached outputs never name a recipe)."""
    return MODELS[model].replace("name: toy\n", f"name: {name}\n") + extra


@pytest.fixture(scope="session")
def warm(tmp_path_factory, tiny_saved_model) -> Path:  # noqa: F811 (the fixture)
    """A workspace whose cache holds both models of `toy`, built cold once."""
    ws = write_workspace(tmp_path_factory.mktemp("warm") / "ws", tiny_saved_model, {"toy": MODELS["b"]})
    for model in ("b", "a"):
        (ws / "recipes" / "toy.yaml").write_text(MODELS[model])
        done = tpubuild(ws, "build")
        assert done.returncode == 0, done.stderr
    return ws


def clone(warm: Path, where: Path, workspace: str = "", recipes: dict[str, str] | None = None) -> Path:
    """A fresh clone of `warm` as CI checks it out: its lock files and its (warm) cache,
    no out/ and nothing else of .tpubuild/ (no note of what was published where);
    `workspace` appended to tpubuild.yaml, `recipes` written over the clone's."""
    shutil.copytree(warm, where, symlinks=True, ignore=shutil.ignore_patterns("out"))
    for path in (where / ".tpubuild").iterdir():
        if path.name != "cache":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    with open(where / "tpubuild.yaml", "a") as f:
        f.write(workspace)
    for name, text in (recipes or {}).items():
        (where / "recipes" / f"{name}.yaml").write_text(text)
    return where


@pytest.fixture(params=["s3", "file"])
def place(request, s3, tmp_path) -> Place:
    if request.param == "s3":
        return s3_place(s3, f"pub-{request.node.name.replace('[', '-').rstrip(']')}-{os.getpid()}")
    return file_place(tmp_path / "mount")


# The CLI in a process that says, last, its exit code and whether TensorFlow was imported.
PROBE = textwrap.dedent(
    """\
    import sys
    from tpubuild.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    print("EXIT", code, "tensorflow" in sys.modules)
    """
)


def probe(ws: Path, *args: str, env: dict | None = None) -> tuple[str, list[str], str]:
    """`tpubuild ARGS` in PROBE: ("EXIT <code> <TensorFlow imported>", the lines before, stderr)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ws, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=300)
    lines = done.stdout.splitlines()
    return (lines[-1] if lines else ""), lines[:-1], done.stderr


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when the socket is: nothing listens there


def build(ws: Path, place: Place | None = None, *args: str, expect: int = 0, env: dict | None = None
          ) -> tuple[dict, str]:
    """`tpubuild build --json ARGS`: (document, stderr)."""
    done = tpubuild(ws, "build", "--json", *args, env={**(place.env if place else {}), **(env or {})})
    assert done.returncode == expect, done.stderr
    return json.loads(done.stdout), done.stderr


def build_text(ws: Path, place: Place, expect: int = 0, env: dict | None = None) -> tuple[list[str], str]:
    """`tpubuild build` as a user reads it: (stdout's lines, stderr)."""
    done = tpubuild(ws, "build", env={**place.env, **(env or {})})
    assert done.returncode == expect, done.stderr
    return done.stdout.splitlines(), done.stderr


def lock_files(ws: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}


def built(doc: dict) -> list[tuple[str, str]]:
    return [(r["recipe"], r["stage"]) for r in doc["rows"] if r["status"] not in ("cached", "up-to-date")]


# --- 1. where versions go ---------------------------------------------------------------
def test_publish_to_of_the_workspace_a_recipes_own_and_null_and_a_new_destination_reruns_no_stage(
        warm, s3, tmp_path):
    mount = file_place(tmp_path / "mount")
    bucket = s3_place(s3, f"pub-override-{os.getpid()}")
    ws = clone(warm, tmp_path / "ws", recipes={
        "other": recipe("a", "other"),
        "local": recipe("a", "local", "publish_to: null\n"),
    })
    build(ws)  # no destination yet: the lock files of all three
    locks = lock_files(ws)
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"publish_to: {mount.url}\n")
    with open(ws / "recipes" / "other.yaml", "a") as f:
        f.write(f"publish_to: {bucket.url}/\n")

    doc, err = build(ws, bucket)
    assert built(doc) == []  # a destination is not part of what is built
    assert lock_files(ws) == locks
    assert doc["destinations"] == {
        "toy": {"url": f"{mount.url}/toy", "version": 1, "new": True, "mended": [], "pruned": []},
        "other": {"url": f"{bucket.url}/other", "version": 1, "new": True, "mended": [], "pruned": []},
    }
    assert mount.versions("toy") == [1] and mount.versions("other") == mount.versions("local") == []
    assert bucket.versions("other") == [1] and bucket.versions("toy") == []
    # The version there is out/'s, byte for byte (the numbers agree: nothing renumbered).
    local = {p.relative_to(ws / "out" / "toy" / "1").as_posix(): p.read_bytes()
             for p in (ws / "out" / "toy" / "1").rglob("*") if p.is_file()}
    assert {rel: mount.read(f"toy/1/{rel}") for rel in local} == local
    assert {rel[len("toy/1/"):] for rel in mount.listing() if rel.startswith("toy/1/")} == set(local)
    assert mount.leftovers() == bucket.leftovers() == []  # 2. no staging, no seal left behind
    assert "Traceback" not in err


def test_validate_names_the_line_of_a_bad_publish_to(warm, tmp_path):
    ws = clone(warm, tmp_path / "ws", workspace="publish_to: ftp://host/models\n")
    done = tpubuild(ws, "validate")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = len((ws / "tpubuild.yaml").read_text().splitlines())
    assert f"tpubuild.yaml:{line}:" in done.stderr and "ftp:// scheme is not supported" in done.stderr, done.stderr

    ws = clone(warm, tmp_path / "ws2", recipes={"toy": recipe("a", extra="publish_to: s3://me:secret@bucket/m\n")})
    done = tpubuild(ws, "validate")
    line = len((ws / "recipes" / "toy.yaml").read_text().splitlines())
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"recipes/toy.yaml:{line}:" in done.stderr and "credentials" in done.stderr, done.stderr
    assert "secret" not in done.stderr  # never echoed


# --- 3. and 7. a fresh clone numbers after the destination; signed versions there ----------
def test_a_fresh_clone_publishes_after_the_destinations_versions_signed_and_an_unchanged_one_nothing(
        warm, place, tmp_path):
    private, public = key_pair(tmp_path, "ci")
    settings = f"publish_to: {place.url}\nsigning: {{key: {private}}}\n"
    # Some CI job published model a, then b: versions 1 and 2.
    first = clone(warm, tmp_path / "first", settings)
    build(first, place)
    (first / "recipes" / "toy.yaml").write_text(MODELS["b"])
    doc, _ = build(first, place)
    assert doc["destinations"]["toy"]["version"] == 2 and place.versions() == [1, 2]
    claims = {rel for rel in place.listing() if "/.tpubuild/claims/" in rel}

    # A fresh clone with model a: out/toy/1 here, 3 there, its manifest saying 3, signed anew.
    ws = clone(warm, tmp_path / "ws", settings)
    out, err = build_text(ws, place)
    assert "published: toy -> out/toy/1" in out and f"published: toy -> {place.url}/toy/3" in out, out
    assert place.versions() == [1, 2, 3] and place.leftovers() == []
    local = json.loads((ws / "out" / "toy" / "1" / MANIFEST).read_text())
    there = place.manifest(3)
    assert there["version"] == 3 and local["version"] == 1
    assert {k: v for k, v in there.items() if k != "version"} == {k: v for k, v in local.items() if k != "version"}
    for rel in local["files"]:  # the model's files are out/'s
        assert place.read(f"toy/3/{rel}") == (ws / "out" / "toy" / "1" / rel).read_bytes()
    # 7. Its in-toto statement names the renumbered manifest; its signature covers it.
    statement = json.loads(place.read("toy/3/tpubuild-provenance.json"))
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects["tpubuild-manifest.json"] == hashlib.sha256(place.read(f"toy/3/{MANIFEST}")).hexdigest()
    assert subjects["saved_model.pb"] == hashlib.sha256(place.read("toy/3/saved_model.pb")).hexdigest()
    assert "toy/3/model.sig" in place.listing()
    done = tpubuild(ws, "verify", f"{place.url}/toy/3", "--key", str(public), env=place.env)
    assert done.returncode == 0, done.stderr
    assert "every file matches its manifest and its signature" in done.stdout
    # A path that is not a version: exit 2, as docs/commands.md says (tests/remote/test_verify_trust.py).
    give = "give a version: <destination>/<recipe>/<N> or <destination>/<recipe>/<target>/<N>"
    done = tpubuild(ws, "verify", f"{place.url}/toy/9", env=place.env)  # no such version: said so
    assert done.returncode == 2 and done.stderr == f"error: {place.url}/toy/9: nothing there ({give})\n", done.stderr
    done = tpubuild(ws, "verify", f"{place.url}/toy", env=place.env)  # the base path: refused before any listing
    assert done.returncode == 2 and done.stderr == f"error: {place.url}/toy: not a version ({give})\n", done.stderr
    if place.url.startswith("file://"):  # the check can fail (a bucket's bytes are checked the same way)
        _, other = key_pair(tmp_path, "other")
        done = tpubuild(ws, "verify", f"{place.url}/toy/3", "--key", str(other))
        assert done.returncode == 1 and "Traceback" not in done.stderr

    # The same clone again: a no-op build, nothing published, no new claim.
    doc, _ = build(ws, place)
    assert built(doc) == [] and "destinations" not in doc
    # Another fresh clone of model a: the newest there holds it, nothing published.
    again = clone(warm, tmp_path / "again", settings)
    out, _ = build_text(again, place)
    assert f"toy: {place.url}/toy/3 holds this model already (nothing published there)" in out, out
    assert not [line for line in out if line.startswith("published: toy -> ") and "://" in line]
    assert {rel for rel in place.listing() if "/.tpubuild/claims/" in rel} == claims | {"toy/.tpubuild/claims/3"}

    # A no-op build contacts no destination (it succeeds while the destination is
    # unreachable) and imports no TensorFlow.
    gone = unreachable(place, tmp_path)
    last, _, err = probe(again, "build", env=gone.env)
    assert last == "EXIT 0 False" and "not published" not in err, (last, err)


def unreachable(place: Place, tmp_path: Path) -> Place:
    """`place` made unreachable: S3 at a closed port, or the mount moved away."""
    if place.url.startswith("s3://"):
        return Place(place.url, {**place.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"},
                     place.listing, place.read)
    root = Path(place.url[len("file://"):])
    if root.exists():
        root.rename(tmp_path / "unmounted")
    return place


# --- 6. faults --------------------------------------------------------------------------
def test_an_unreachable_destination_is_one_line_and_exit_1_and_the_local_version_stays(warm, place, tmp_path):
    gone = unreachable(place, tmp_path)
    ws = clone(warm, tmp_path / "ws", f"publish_to: {place.url}\n")
    # A dry run contacts no destination.
    done = tpubuild(ws, "build", "--dry-run", env=gone.env)
    assert done.returncode == 0 and "publish_to" not in done.stderr + done.stdout, done.stderr
    doc, err = build(ws, gone, expect=1)
    said = [line for line in err.splitlines() if line.strip()]
    assert len(said) == 1 and "Traceback" not in err, err
    assert said[0].startswith(f"recipes/toy.yaml: not published: publish_to {place.url}: ")
    assert said[0].endswith("; out/toy/1 is kept")
    assert doc["exit_code"] == 1 and doc["destinations"]["toy"]["error"] == said[0]
    assert doc["versions"] == {"toy": 1}
    done = tpubuild(ws, "verify", "out/toy/1")
    assert done.returncode == 0, done.stderr
    # (On S3 each command spends seconds in the SDK's retries: verify alone there.)
    commands = [["verify", f"{place.url}/toy/1"]] + ([["clean", "--remote"]] if place.url.startswith("file") else [])
    for command in commands:
        done = tpubuild(ws, *command, env=gone.env)
        said = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 1 and len(said) == 1 and "Traceback" not in done.stderr, (command, done.stderr)
        assert place.url in said[0], said

    # Reachable again: the next build publishes what the failed one could not.
    if place.url.startswith("file://"):
        (tmp_path / "unmounted").rename(place.url[len("file://"):])
    doc, _ = build(ws, place)
    assert doc["destinations"]["toy"]["version"] == 1 and doc["destinations"]["toy"]["new"] is True
    assert place.versions() == [1] and place.leftovers() == []


KILLER = textwrap.dedent(
    """\
    import os, signal, sys
    from tpubuild.cli import main
    from tpubuild.publish import destination

    method, when = sys.argv[1:]
    original = getattr(destination.Destination, method)

    def killed(self, *args, **kwargs):
        if method == "check_tree" and kwargs.get("with_commit", args[-1] if args else False):
            return original(self, *args, **kwargs)  # the check after saved_model.pb: not reached
        if when == "after":
            original(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(destination.Destination, method, killed)
    main(["build"])
    """
)


@pytest.mark.parametrize("kill", ["s3: before saved_model.pb", "file: sealed", "file: staged"])
def test_a_build_killed_in_its_publish_leaves_no_partial_version_and_the_next_build_finishes_it(
        warm, s3, tmp_path, kill):
    """SIGKILL in a build's publish (on S3 once every file but saved_model.pb was copied
    to `<N>/`; on a mount once the version is sealed, or staged and not sealed): TF Serving
    sees no version; the next build completes a sealed one, removes an unsealed staging."""
    method, when = {"s3: before saved_model.pb": ("check_tree", "before"), "file: sealed": ("seal", "after"),
                    "file: staged": ("seal", "before")}[kill]
    place = s3_place(s3, f"pub-killed-{os.getpid()}") if kill.startswith("s3") else file_place(tmp_path / "mount")
    ws = clone(warm, tmp_path / "ws", f"publish_to: {place.url}\n")
    done = subprocess.run([sys.executable, "-c", KILLER, method, when], cwd=ws, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(REPO), **place.env})
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert place.leftovers() != []  # it was killed mid-publish
    assert place.versions() == []  # and TF Serving sees no version
    if method == "check_tree":
        assert place.partial() == ["toy/1"]  # every file but saved_model.pb: no model to a loader

    out, _ = build_text(ws, place)
    if kill == "file: staged":
        assert f"toy: removed {place.url}/toy/.tpubuild/staging/1 (a publish that stopped before it was sealed; " \
               "number 1 stays unused)" in out, out
        assert f"published: toy -> {place.url}/toy/2" in out, out
        number = 2
    else:
        assert f"toy: completed {place.url}/toy/1 (a publish that stopped before it was)" in out, out
        assert f"toy: {place.url}/toy/1 holds this model already (nothing published there)" in out, out
        number = 1
    assert place.versions() == [number] and place.partial() == [] and place.leftovers() == []
    done = tpubuild(ws, "verify", f"{place.url}/toy/{number}", env=place.env)
    assert done.returncode == 0, done.stderr


# --- 4. pruning and clean --remote ------------------------------------------------------
def test_keep_versions_prunes_the_destination_and_clean_remote_keeps_the_newest_and_labelled(
        warm, place, tmp_path):
    ws = clone(warm, tmp_path / "ws", f"publish_to: {place.url}\nkeep_versions: 2\n")
    labelled = "serving: {version_labels: {stable: 1}}\n"
    # A directory tpubuild did not publish: a user's upload, number 0.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "saved_model.pb").write_bytes(b"a user's model")
    (theirs / "README").write_text("uploaded by hand\n")
    if place.url.startswith("file://"):
        shutil.copytree(theirs, Path(place.url[len("file://"):]) / "toy" / "0")
    else:
        for path in theirs.iterdir():
            key = f"{place.url[len(f's3://{BUCKET}/'):]}/toy/0/{path.name}"
            place_s3_put(place, key, path.read_bytes())
    said, warned = [], []
    for model in ("a", "b", "a", "b"):
        (ws / "recipes" / "toy.yaml").write_text(MODELS[model] + labelled)
        out, err = build_text(ws, place)
        said += out
        warned.append(f"warning: {place.url}/toy/0: no readable {MANIFEST}; left in place" in err.splitlines())
    assert warned == [False, True, True, True]  # whenever pruning looks at 0: from three versions on
    # 1 is pinned by its label, 3 and 4 are the newest two: 2 went.
    assert [line for line in said if " pruned " in line] == [f"toy: pruned {place.url}/toy/2 (keep_versions: 2)"]
    assert place.versions() == [0, 1, 3, 4]
    assert sorted(os.listdir(ws / "out" / "toy")) == ["3", "4"]  # out/ pruned by its own rule

    done = tpubuild(ws, "clean", "--remote", env=place.env)
    assert done.returncode == 0, done.stderr
    assert f"removed {place.url}/toy/3" in done.stdout.splitlines()
    assert f"kept {place.url}/toy/: 4 (the newest), 1 (labelled)" in done.stdout.splitlines()
    assert f"warning: {place.url}/toy/0: " in done.stderr and "left in place" in done.stderr
    assert place.versions() == [0, 1, 4] and place.partial() == [] and place.leftovers() == []
    assert place.read("toy/0/README") == b"uploaded by hand\n"
    assert sorted(os.listdir(ws / "out" / "toy")) == ["3", "4"]  # --remote leaves out/ alone
    # Numbers stay used: the next version is 5, not 2 or 3.
    (ws / "recipes" / "toy.yaml").write_text(MODELS["a"] + labelled)
    doc, _ = build(ws, place)
    assert doc["destinations"]["toy"]["version"] == 5


def place_s3_put(place: Place, key: str, data: bytes) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=place.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


# --- 5. serving-config ------------------------------------------------------------------
def test_serving_config_parses_with_tf_servings_protos_and_names_each_base_path(warm, tmp_path):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    ws = clone(warm, tmp_path / "ws", "publish_to: s3://models-bucket/prod/\n", {
        "toy": recipe("a", extra="serving: {version_labels: {stable: 3, canary: 4}}\n"),
        "shared": recipe("a", "shared", "publish_to: file:///srv/models\n"),
        "local": recipe("a", "local", "publish_to: null\n"),
    })
    done = tpubuild(ws, "serving-config")
    assert done.returncode == 0, done.stderr
    config = text_format.Parse(done.stdout, model_server_config_pb2.ModelServerConfig())
    models = {m.name: m for m in config.model_config_list.config}
    assert set(models) == {"toy", "shared", "local"}
    assert models["toy"].base_path == "s3://models-bucket/prod/toy"
    assert models["shared"].base_path == "file:///srv/models/shared"
    assert models["local"].base_path == str((ws / "out" / "local").resolve())
    assert {m.model_platform for m in models.values()} == {"tensorflow"}
    assert dict(models["toy"].version_labels) == {"stable": 3, "canary": 4}
    assert list(models["toy"].model_version_policy.specific.versions) == [3, 4]
    assert models["shared"].model_version_policy.WhichOneof("policy_choice") is None  # TF Serving's default: latest
    assert not models["shared"].version_labels

    # -o FILE, one recipe; the command imports no TensorFlow.
    target = tmp_path / "models.config"
    last, said, err = probe(ws, "serving-config", "toy", "-o", str(target))
    assert last == "EXIT 0 False" and said == [f"wrote {target} (1 model)"], (last, said, err)
    written = text_format.Parse(target.read_text(), model_server_config_pb2.ModelServerConfig())
    assert [m.name for m in written.model_config_list.config] == ["toy"]
    assert written.model_config_list.config[0] == models["toy"]
    assert not list(ws.rglob("out"))  # it read no model and built nothing
