"""The remote cache against a real S3-protocol server, through real builds."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import time

import blake3
import pytest

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import source_recipe
from tests.remote.conftest import (
    BUCKET,
    RECIPES,
    SHARED,
    build_remote,
    copy_tree,
    lock_files,
    published,
    stage_keys,
)


def _digest(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def assert_sound(objects: dict[str, bytes], prefix: str) -> None:
    """The remote's invariants: every object's content hashes to its name (never a part
    of one under its final name), and every record's objects are all there."""
    stored = {}
    for name, data in objects.items():
        if name.startswith(f"{prefix}/v1/objects/"):
            digest = "".join(name.split("/")[-2:])
            assert _digest(data) == digest, f"{name} holds other content"
            stored[digest] = len(data)
    for name, data in objects.items():
        if name.startswith(f"{prefix}/v1/stages/"):
            for path, digest, size in json.loads(data)["files"]:
                assert stored.get(digest) == size, f"record {name} names {path}, whose object {digest} is absent"


def test_the_cold_build_uploaded_every_stage(pushed, s3):
    _, doc = pushed
    keys = stage_keys(doc)
    assert {r["status"] for r in doc["rows"]} == {"built"}
    remote = doc["remote"]
    assert remote["url"] == SHARED
    assert (remote["uploads"], remote["hits"], remote["failures"]) == (len(set(keys.values())), 0, [])
    assert remote["misses"] == len(keys) and remote["bytes_up"] > 0
    objects = s3.keys("shared")
    assert {f"shared/v1/stages/{k[:2]}/{k}.json" for k in keys.values()} <= set(objects)
    assert_sound(objects, "shared")


def test_a_second_workspace_sharing_only_the_remote_builds_nothing(pushed, s3, fresh):
    first, cold = pushed
    ws = fresh("second")
    doc, stderr = build_remote(ws, s3, "--remote-cache", SHARED)
    stored = [r for r in doc["rows"] if r["stage"] != "publish"]
    assert {(r["status"], r["remote"]) for r in stored} == {("cached", True)}, stderr
    assert stage_keys(doc) == stage_keys(cold)
    assert doc["remote"]["hits"] == len(stored) and doc["remote"]["misses"] == 0
    assert doc["remote"]["uploads"] == 0 and doc["remote"]["bytes_down"] > 0
    assert not glob.glob(str(ws / ".tpubuild" / "logs" / "*")), "a stage ran"
    assert published(ws) == published(first)
    assert lock_files(ws) == lock_files(first)
    # The records are local now: the next build is a no-op that never asks the remote.
    again, _ = build_remote(ws, s3, "--remote-cache", SHARED)
    assert "remote" not in again and {r["status"] for r in again["rows"]} == {"cached"}


def test_a_read_only_builder_downloads_and_uploads_nothing(pushed, s3, fresh):
    _, cold = pushed
    url = s3.copy_prefix("shared", "readonly", without=(stage_keys(cold)[("toy", "source")],))
    before = s3.keys("readonly")
    ws = fresh("readonly")
    result = tpubuild(ws, "build", "--remote-cache", url, "--remote-cache-read-only", env=s3.env)
    assert result.returncode == 0, result.stderr
    assert "toy: source: built" in result.stdout  # which a builder that pushes would upload
    line = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"remote cache {url}: 7 hits, 1 misses, 0 uploads, \d+\.\d MiB down, 0\.0 MiB up", line)
    assert s3.keys("readonly") == before


@pytest.mark.slow
def test_two_builders_racing_on_one_key_leave_one_record(pushed, s3, fresh):
    """Two builders both decide to run the export (its record is missing from the
    remote), wait in it until the SLOW files go, then finish and upload the same key at
    once: one record, created by exactly one of them; both builds succeed."""
    _, cold = pushed
    export = stage_keys(cold)[("cut", "export")]
    url = s3.copy_prefix("shared", "race", without=(export,))
    workspaces = [fresh(f"racer{i}", {"cut": RECIPES["cut"]}) for i in range(2)]
    for ws in workspaces:
        (ws / "recipes" / "models" / "SLOW").write_text("")
    procs = [subprocess.Popen([*CLI, "build", "--json", "--remote-cache", url], cwd=ws, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO), **s3.env}) for ws in workspaces]
    deadline = time.monotonic() + 120
    while not all(glob.glob(str(ws / ".tpubuild/cache/v1/tmp/*/export-*")) for ws in workspaces):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the exports never started"
        time.sleep(0.05)
    for ws in workspaces:  # both are running the export now: release them together
        (ws / "recipes" / "models" / "SLOW").unlink()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    docs = [json.loads(out) for out, _ in outs]
    for doc in docs:
        assert {r["stage"]: r["status"] for r in doc["rows"]}["export"] == "built"
    record = f"race/v1/stages/{export[:2]}/{export}.json"
    objects = s3.keys("race")
    # Create-only: exactly one of them counts the upload (a plain PUT would count two)...
    assert sorted(doc["remote"]["uploads"] for doc in docs) == [0, 1]
    # ...and the record is byte for byte the one its creator holds (never overwritten).
    creator = workspaces[[doc["remote"]["uploads"] for doc in docs].index(1)]
    assert objects[record] == (creator / ".tpubuild/cache/v1/stages" / export[:2] / f"{export}.json").read_bytes()
    assert_sound(objects, "race")


@pytest.mark.slow
def test_a_builder_killed_mid_upload_leaves_no_record_without_its_objects(s3, fresh):
    ws = fresh("killed", {"toy": source_recipe("toy")})
    big = ws / "recipes" / "models" / "tiny" / "zz_big.bin"  # the source snapshot's last object
    big.write_bytes(os.urandom(48 << 20))
    url = f"s3://{BUCKET}/kill"
    proc = subprocess.Popen([*CLI, "build", "--remote-cache", url], cwd=ws, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **s3.env})
    deadline = time.monotonic() + 120
    while not s3.client.list_objects_v2(Bucket=BUCKET, Prefix="kill/v1/objects/").get("KeyCount"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its worker, mid-upload
    proc.wait()
    killed = s3.keys("kill")
    assert_sound(killed, "kill")
    local = [json.loads(p.read_text()) for p in (ws / ".tpubuild/cache/v1/stages").glob("*/*.json")]
    source = next(entry["key"] for entry in local if entry["stage"] == "source")
    assert f"kill/v1/stages/{source[:2]}/{source}.json" not in killed  # the kill came before its record
    result = tpubuild(ws, "build", "--remote-cache", url, env=s3.env)
    assert result.returncode == 0, result.stderr
    after = s3.keys("kill")
    assert_sound(after, "kill")
    assert any(name.startswith("kill/v1/stages/") for name in after)


def test_corrupted_and_truncated_remote_objects_are_reported_rebuilt_and_replaced(pushed, s3, fresh):
    first, cold = pushed
    url = s3.copy_prefix("shared", "corrupt")
    source_key = stage_keys(cold, "toy")[("toy", "source")]
    record = s3.record("corrupt", source_key)
    files = {path: digest for path, digest, _ in record["files"]}
    flipped, cut = files["saved_model.pb"], files["variables/variables.data-00000-of-00001"]
    for digest, change in ((flipped, lambda b: bytes([b[0] ^ 0xFF]) + b[1:]), (cut, lambda b: b[: len(b) // 2])):
        key = f"corrupt/v1/objects/{digest[:2]}/{digest[2:]}"
        data = s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=change(data))
    ws = fresh("victim", {"toy": source_recipe("toy")})
    doc, stderr = build_remote(ws, s3, "--remote-cache", url)
    failures = doc["remote"]["failures"]
    assert len(failures) == 2, stderr
    assert any(f"{url}: object {flipped} " in f and "is corrupted" in f for f in failures)
    assert any(f"{url}: object {cut} " in f and "is truncated" in f for f in failures)
    assert all(f in stderr.splitlines() for f in failures)
    rows = {r["stage"]: (r["status"], r["remote"]) for r in doc["rows"]}
    assert rows["source"] == ("built", False)  # never used: snapshotted again from the model
    assert {rows[s] for s in ("batch", "verify", "report")} == {("cached", True)}
    assert published(ws)["out/toy/1/saved_model.pb"] == published(first)["out/toy/1/saved_model.pb"]
    assert {p: d for p, d in published(ws).items() if p.startswith("out/toy/")} == \
        {p: d for p, d in published(first).items() if p.startswith("out/toy/")}
    assert_sound(s3.keys("corrupt"), "corrupt")  # the rebuild's upload replaced both objects


def test_an_unreachable_server_is_said_once_and_the_build_goes_on_locally(pushed, s3, tmp_path):
    first, cold = pushed
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ws = copy_tree(first, tmp_path / "ws")
    source = stage_keys(cold)[("toy", "source")]
    (ws / ".tpubuild/cache/v1/stages" / source[:2] / f"{source}.json").unlink()  # a local miss: asks the remote
    start = time.monotonic()
    doc, stderr = build_remote(ws, s3, "toy", "--remote-cache", f"s3://{BUCKET}/x",
                               env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    assert time.monotonic() - start < 120
    assert [(r["stage"], r["status"]) for r in doc["rows"]][:2] == [("source", "built"), ("batch", "cached")]
    lines = [line for line in stderr.splitlines() if "unreachable" in line]
    assert len(lines) == 1 and lines[0].startswith(f"remote cache s3://{BUCKET}/x unreachable: ")
    assert lines[0].endswith("; building locally") and doc["remote"]["failures"] == lines
    assert doc["exit_code"] == 0 and doc["remote"]["uploads"] == 0


def test_gc_remote_keeps_what_lock_files_name_and_only_touches_its_layout(pushed, s3, tmp_path):
    first, cold = pushed
    url = s3.copy_prefix("shared", "gc")
    for key in ("gc/README.txt", "gc/v2/objects/ab/cd"):  # not the cache's: never deleted
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"mine")
    ws = copy_tree(first, tmp_path / "ws")
    for name in ("cut.yaml", "cut.lock.yaml"):
        (ws / "recipes" / name).unlink()
    result = tpubuild(ws, "gc", "--remote-cache", url, env=s3.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"remote cache {url}: removed 0 stage records and 0 objects")
    result = tpubuild(ws, "gc", "--remote-cache", url, "--keep-days", "0", env=s3.env)
    assert result.returncode == 0, result.stderr
    toy = set(stage_keys(cold, "toy").values())
    cut = set(stage_keys(cold, "cut").values()) - toy
    assert re.match(rf"remote cache {url}: removed {len(cut)} stage records and \d+ objects", result.stdout)
    after = s3.keys("gc")
    records = {name.split("/")[-1].removesuffix(".json") for name in after if name.startswith("gc/v1/stages/")}
    assert records == toy
    assert not any(name.startswith("gc/v1/discovered/") for name in after)  # the export's candidate went too
    named = {digest for name, data in after.items() if name.startswith("gc/v1/stages/")
             for _, digest, _ in json.loads(data)["files"]}
    assert {"".join(n.split("/")[-2:]) for n in after if n.startswith("gc/v1/objects/")} == named
    assert after["gc/README.txt"] == after["gc/v2/objects/ab/cd"] == b"mine"
    assert_sound(after, "gc")


def test_a_record_whose_object_was_evicted_is_a_miss_and_a_rebuild(pushed, s3, fresh):
    """A bucket lifecycle rule or another team's gc removed an object a record names:
    the record is a miss (the build rebuilds that stage), never a failed build."""
    first, cold = pushed
    url = s3.copy_prefix("shared", "evicted")
    source_key = stage_keys(cold, "toy")[("toy", "source")]
    record = s3.record("evicted", source_key)
    gone = {path: digest for path, digest, _ in record["files"]}["saved_model.pb"]
    s3.client.delete_object(Bucket=BUCKET, Key=f"evicted/v1/objects/{gone[:2]}/{gone[2:]}")
    ws = fresh("after-eviction", {"toy": source_recipe("toy")})
    doc, stderr = build_remote(ws, s3, "--remote-cache", url)
    rows = {r["stage"]: (r["status"], r["remote"]) for r in doc["rows"]}
    assert rows["source"] == ("built", False), stderr  # rebuilt, not failed
    assert {rows[s] for s in ("batch", "verify", "report")} == {("cached", True)}
    assert {p: d for p, d in published(ws).items() if p.startswith("out/toy/")} == \
        {p: d for p, d in published(first).items() if p.startswith("out/toy/")}
    assert_sound(s3.keys("evicted"), "evicted")  # the rebuild's upload put the object back
