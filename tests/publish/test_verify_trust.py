"""Issue 46, the verify side: what a co-writer of a publish destination puts there is data
to `tpubuild verify`, never a path, a verdict or a version number it takes on trust; and
what a newcomer meets publishing to a mount (publish_to values, the base install, exit
codes, the summary line). Against moto's S3 server on 127.0.0.1 and a file:// mount in
tmp_path; the co-writer's objects are put there past tpubuild, as their own CI job would.

Built once per session (tests/publish/test_publish_to.py `warm`): each test copies the
workspace, so only the publish runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.cli import REPO, tpubuild
from tests.provenance.test_signed_versions import key_pair
from tests.publish.test_publish_to import (  # noqa: F401 (fixtures)
    MODELS,
    build,
    build_text,
    clone,
    place,
    recipe,
    unreachable,
    warm,
)
from tests.remote.conftest import BUCKET
from tests.remote.places import MANIFEST, Place, s3_place


def signed_destination(warm: Path, place: Place, tmp_path: Path, name: str = "ws") -> tuple[Path, Path]:
    """A clone of `warm` that signs and publishes to `place`, built once: toy/1 there.
    (workspace, the public key)."""
    private, public = key_pair(tmp_path, f"{name}-key")
    ws = clone(warm, tmp_path / name, f"publish_to: {place.url}\nsigning: {{key: {private}}}\n")
    doc, _ = build(ws, place)
    assert doc["destinations"]["toy"]["version"] == 1
    return ws, public


def put(place: Place, rel: str, data: bytes, s3=None) -> None:
    """What a co-writer writes at `rel` below the destination, past tpubuild."""
    if place.url.startswith("s3://"):
        prefix = place.url[len(f"s3://{BUCKET}/"):]
        s3.client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=data)
    else:
        path = Path(place.url[len("file://"):]) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            os.chmod(path, 0o644)
        path.write_bytes(data)


def copy_version(place: Place, src: str, dst: str, s3=None) -> None:
    """A co-writer's copy of every object of `src` (`toy/1`) as `dst` (`toy/3`)."""
    for rel in sorted(place.listing()):
        if rel.startswith(f"{src}/"):
            put(place, dst + rel[len(src):], place.read(rel), s3)


def errors(done) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


# --- 3. object keys are names, not paths ------------------------------------------------
def test_verify_url_never_writes_an_object_key_as_a_path_outside_its_directory(warm, s3, tmp_path):
    place = s3_place(s3, f"keys-{os.getpid()}")
    ws, public = signed_destination(warm, place, tmp_path)
    planted = tmp_path / "victim" / "recipes" / "models" / "toy.py"
    # A double slash: the key below `toy/1/` is an absolute path.
    put(place, f"toy/1//{planted.relative_to('/')}", b"import os  # the co-writer's code\n", s3)
    put(place, "toy/1/variables/../../../escaped.py", b"print('out')\n", s3)
    for extra in ([], ["--key", str(public)]):
        done = tpubuild(ws, "verify", f"{place.url}/toy/1", *extra, env=place.env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        said = errors(done)
        assert f"{place.url}/toy/1: '/{planted.relative_to('/')}': an object whose name is not a clean relative " \
               "path; not downloaded" in said, said
        assert f"{place.url}/toy/1: 'variables/../../../escaped.py': an object whose name is not a clean relative " \
               "path; not downloaded" in said, said
        assert "every file matches" not in done.stdout
        assert not planted.exists() and not (tmp_path / "escaped.py").exists()
    # The same version without the co-writer's objects verifies.
    clean = s3_place(s3, f"keys-clean-{os.getpid()}")
    for rel in place.listing():
        if rel.startswith("toy/1/") and "//" not in rel and "/../" not in rel:
            put(clean, rel, place.read(rel), s3)
    done = tpubuild(ws, "verify", f"{clean.url}/toy/1", "--key", str(public), env=clean.env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{clean.url}/toy/1: every file matches its manifest and its signature by {public}\n"


# --- 8. a signed version replayed under another number or recipe -------------------------
def test_verify_url_refuses_a_signed_version_copied_under_another_number_or_recipe(warm, place, s3, tmp_path):
    ws, public = signed_destination(warm, place, tmp_path)
    copy_version(place, "toy/1", "toy/3", s3)
    copy_version(place, "toy/1", "toy2/1", s3)
    done = tpubuild(ws, "verify", f"{place.url}/toy/3", "--key", str(public), env=place.env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors(done) == [
        f"{place.url}/toy/3: tpubuild-manifest.json: says toy/1, not toy/3 (a version copied from elsewhere?)",
        f"{place.url}/toy/3: tpubuild-provenance.json: says 'toy/1', not toy/3 (a version copied from elsewhere?)",
    ], done.stderr
    done = tpubuild(ws, "verify", f"{place.url}/toy2/1", "--key", str(public), env=place.env)
    assert done.returncode == 1
    assert errors(done) == [
        f"{place.url}/toy2/1: tpubuild-manifest.json: says toy/1, not toy2/1 (a version copied from elsewhere?)",
        f"{place.url}/toy2/1: tpubuild-provenance.json: says 'toy/1', not toy2/1 (a version copied from elsewhere?)",
    ], done.stderr
    done = tpubuild(ws, "verify", f"{place.url}/toy/1", "--key", str(public), env=place.env)
    assert done.returncode == 0, done.stderr
    if place.url.startswith("file://"):  # the mount read as a local directory: the same check
        mount = Path(place.url[len("file://"):])
        done = tpubuild(ws, "verify", str(mount / "toy" / "3"), "--key", str(public))
        assert done.returncode == 1 and errors(done)[0] == (
            f"{mount}/toy/3: tpubuild-manifest.json: says toy/1, not toy/3 (a version copied from elsewhere?)")


# --- 9. names and sizes a manifest lists ------------------------------------------------
def test_verify_opens_only_clean_names_and_compares_sizes_before_hashing(warm, place, s3, tmp_path):
    ws, public = signed_destination(warm, place, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the victim's secret\n")
    from tpubuild.digests import hash_file

    manifest = place.manifest(1)
    forged = dict(manifest, files={**manifest["files"], str(secret): hash_file(secret)})
    put(place, f"toy/1/{MANIFEST}", json.dumps(forged).encode(), s3)
    done = tpubuild(ws, "verify", f"{place.url}/toy/1", env=place.env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors(done) == [f"{place.url}/toy/1: {str(secret)!r}: listed under a name that is not a clean relative "
                            "path; not opened"], done.stderr
    put(place, f"toy/1/{MANIFEST}", json.dumps(manifest).encode(), s3)

    # A listed file replaced by a 200 GiB sparse one: refused by its size, never hashed.
    data = "variables/variables.data-00000-of-00001"
    size = manifest["sizes"][data]
    local = ws / "out" / "toy" / "1"
    os.chmod(local / data, 0o644)
    os.truncate(local / data, 200 << 30)
    started = time.monotonic()
    done = tpubuild(ws, "verify", str(local), "--key", str(public))
    assert time.monotonic() - started < 60
    assert done.returncode == 1 and errors(done) == [
        f"{local}: {data}: {200 << 30} bytes, more than the {size} its manifest lists; not hashed",
        f"{local}: model.sig: not checked (a file above is not what its manifest lists, and is not read)",
    ], done.stderr
    # A link where a listed file should be: not followed.
    os.unlink(local / data)
    os.symlink(secret, local / data)
    done = tpubuild(ws, "verify", str(local))
    assert done.returncode == 1
    assert errors(done) == [f"{local}: {data}: a symbolic link, not a regular file; not read",
                            f"{local}: {data} (a symbolic link): not in the manifest"], done.stderr
    # On the destination: an object larger than listed is not downloaded.
    if place.url.startswith("s3://"):
        put(place, f"toy/1/{data}", b"\0" * (size + 1), s3)
        done = tpubuild(ws, "verify", f"{place.url}/toy/1", "--key", str(public), env=place.env)
        assert done.returncode == 1 and errors(done) == [
            f"{place.url}/toy/1: {data}: {size + 1} bytes, more than the {size} its manifest lists; not downloaded",
            f"{place.url}/toy/1: model.sig: not checked (a file above is not what its manifest lists, and is not "
            "read)"], done.stderr


# --- 12. publish_to values: validate refuses what build refuses ---------------------------
@pytest.mark.parametrize("value, message", [
    ("file://", "'file://': a file:// URL needs an absolute path (file:///shared/dir)"),
    ("FILE:///tmp", "'FILE:///tmp': write the scheme in lower case (file://)"),
    ("file:///tmp/../etc", "'file:///tmp/../etc': the path must be plain and normalized (no '.', '..', '//' or "
                           "%-escapes)"),
    ("file:///proc/self", "'file:///proc/self': /proc/self is in a kernel file system, not a shared directory"),
    ('"s3://bucket/models x"', "'s3://bucket/models x' holds a space or a control character"),
    ('"s3://bucket/models\\nx"', "'s3://bucket/models\\nx' holds a space or a control character"),
])
def test_validate_and_build_refuse_the_same_publish_to_values_with_file_and_line(warm, tmp_path, value, message):
    ws = clone(warm, tmp_path / "ws", f"publish_to: {value}\n")
    line = len((ws / "tpubuild.yaml").read_text().splitlines())
    for verb in ("validate", "build"):
        done = tpubuild(ws, verb)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (verb, done.stderr)
        assert errors(done) == [f"tpubuild.yaml:{line}:13: publish_to: {message}"], (verb, done.stderr)
    # A recipe's own publish_to: the same checker, at the recipe's line.
    ws = clone(warm, tmp_path / "ws2", recipes={"toy": recipe("a", extra=f"publish_to: {value}\n")})
    line = len((ws / "recipes" / "toy.yaml").read_text().splitlines())
    done = tpubuild(ws, "validate")
    assert done.returncode == 2 and f"recipes/toy.yaml:{line}:" in done.stderr and message in done.stderr, done.stderr


# --- 13. what a newcomer meets ----------------------------------------------------------
def test_the_base_install_publishes_and_verifies_to_a_mount_without_fsspec(warm, tmp_path):
    # fsspec importable as nothing: the remote extra is not installed.
    blocker = tmp_path / "no-extra"
    blocker.mkdir()
    (blocker / "fsspec.py").write_text("raise ImportError('No module named fsspec')\n")
    mount = tmp_path / "mount"
    mount.mkdir()
    ws = clone(warm, tmp_path / "ws", f"publish_to: file://{mount}\n")
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"}
    done = tpubuild(ws, "build", env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"published: toy -> file://{mount}/toy/1" in done.stdout, done.stdout
    done = tpubuild(ws, "verify", f"file://{mount}/toy/1", env=env)
    assert done.returncode == 0 and done.stdout == f"file://{mount}/toy/1: every file matches its manifest\n", \
        done.stderr


def test_verify_exit_codes_follow_the_docs_and_its_errors_name_the_url(warm, place, s3, tmp_path):
    ws, _ = signed_destination(warm, place, tmp_path)
    give = "give a version: <destination>/<recipe>/<N> or <destination>/<recipe>/<target>/<N>"
    for arg, message in [
        (f"{place.url}/toy", f"error: {place.url}/toy: not a version ({give})"),
        (f"{place.url}/toy/9", f"error: {place.url}/toy/9: nothing there ({give})"),
        (place.url, f"error: {place.url}: not a version ({give})"),
        ("out/toy", "error: out/toy: not a version (give a published version, e.g. out/<recipe>/<N>)"),
        ("out", "error: out: not a version (give a published version, e.g. out/<recipe>/<N>)"),
        ("out/toy/7", "error: out/toy/7: not a directory (give a published version, e.g. out/<recipe>/<N>)"),
    ]:
        done = tpubuild(ws, "verify", arg, env=place.env)
        assert done.returncode == 2 and done.stderr == message + "\n", (arg, done.stderr)
    if place.url.startswith("s3://"):  # an unreachable bucket: the URL given, not a setting's name
        gone = unreachable(place, tmp_path)
        done = tpubuild(ws, "verify", f"{place.url}/toy/1", env=gone.env)
        said = errors(done)
        assert done.returncode == 1 and len(said) == 1 and "Traceback" not in done.stderr, done.stderr
        assert said[0].startswith(f"error: {place.url}/toy/1: cannot list it: ") and "publish_to" not in said[0]


def test_a_build_whose_publish_failed_says_so_in_its_summary_line(warm, place, tmp_path):
    gone = unreachable(place, tmp_path)
    ws = clone(warm, tmp_path / "ws", f"publish_to: {place.url}\n")
    out, err = build_text(ws, gone, expect=1)
    assert out[-1].startswith("1 recipe: ") and out[-1].endswith(", 1 not published to its destination"), out
    assert "not published: publish_to" in err
