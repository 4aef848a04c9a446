"""Issue 39, finding 7: a remote cache never hangs a build. A FIFO or a device in a
file:// remote is refused without being opened; a DNS server that never answers costs
the call's deadline, and the process exits when the build is done (the resolver thread
is not waited for)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli import REPO
from tests.remote.conftest import BUCKET, copy_tree, stage_keys

RECORD = {"stage": "export", "inputs": {}}  # what a stage key is taken of (keys/stage.py)


def _pushed_to_a_directory(tmp_path: Path, said: list[str]):
    """A store with one record pushed to a file:// remote; (remote, entry)."""
    from tpubuild.digests import StatCache
    from tpubuild.keys import stage_key
    from tpubuild.remote import RemoteCache, push_entry
    from tpubuild.store import Store

    store = Store(tmp_path / "cache")
    key = stage_key(RECORD)
    out = store.new_workdir("stage") / "out"
    out.mkdir()
    (out / "saved_model.pb").write_text("a model")
    entry = store.put(key, "stage", out, {}, [], RECORD, StatCache(None))
    remote = RemoteCache(f"file://{tmp_path / 'remote'}", report=said.append)
    assert push_entry(remote, entry, store)
    store.close()
    return remote, entry


def test_fifos_and_devices_in_a_file_remote_are_refused_without_opening(tmp_path):
    from tpubuild.remote import fetch_entry, push_objects
    from tpubuild.store import Store

    said: list[str] = []
    remote, entry = _pushed_to_a_directory(tmp_path, said)
    key = entry.key
    v1 = tmp_path / "remote" / "v1"
    record = v1 / "stages" / key[:2] / f"{key}.json"
    digest = entry.files[0].hash
    obj = v1 / "objects" / digest[:2] / digest[2:]
    kept = record.read_bytes()
    record.unlink()
    os.mkfifo(record)  # before issue 39: open() blocked the build forever
    start = time.monotonic()
    assert fetch_entry(remote, key, Store(tmp_path / "fresh-1")) is None
    record.unlink()
    record.write_bytes(kept)
    obj.unlink()
    if os.geteuid() == 0:
        os.mknod(obj, 0o444 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's, which never ends
        what = "a device file"
    else:
        os.mkfifo(obj)
        what = "a FIFO (named pipe)"
    assert fetch_entry(remote, key, Store(tmp_path / "fresh-2")) is None
    assert time.monotonic() - start < 10
    url = f"file://{tmp_path / 'remote'}"
    assert said == [
        f"remote cache {url}: stage record {key} is a FIFO (named pipe), not a regular file; not opened",
        f"remote cache {url}: object {digest} of stage record {key} is {what}, not a regular file (not opened); "
        "not used",
    ]
    assert remote.enabled  # one bad name is a miss, not the remote's end
    listed = remote.backend().list("objects")
    assert listed == []  # what gc --remote would list: no special file
    # A push replaces the special file by the object (a rename: never written into).
    assert push_objects(remote, entry.files, Store(tmp_path / "cache"))
    assert obj.is_file() and obj.read_text() == "a model"


def _unshare_mount_works(resolv: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && cat /etc/resolv.conf',
                            str(resolv)], capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout == resolv.read_text()


class _SilentDns:
    """A UDP socket on port 53 of a loopback address that reads every query and never answers."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 53))
        self.queries = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                self.sock.recvfrom(4096)
            except OSError:
                return
            self.queries += 1

    def close(self) -> None:
        self.sock.close()


def test_a_dns_server_that_never_answers_costs_the_deadline_and_the_build_exits_when_done(pushed, s3, tmp_path):
    # The build runs in a mount namespace whose /etc/resolv.conf names the silent server
    # (glibc reads nothing else for a name server), with a resolver timeout of 30 s.
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.77\noptions timeout:30 attempts:1\n")
    if not _unshare_mount_works(resolv):
        pytest.skip("needs root, `unshare -m` and `mount --bind` to give the build its own /etc/resolv.conf")
    try:
        dns = _SilentDns("127.0.0.77")
    except OSError as exc:
        pytest.skip(f"cannot listen on 127.0.0.77:53 ({exc})")
    first, cold = pushed
    ws = copy_tree(first, tmp_path / "ws")
    source = stage_keys(cold)[("toy", "source")]
    (ws / ".tpubuild/cache/v1/stages" / source[:2] / f"{source}.json").unlink()  # a local miss: asks the remote
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"remote_cache: {{url: 's3://{BUCKET}/x', connect_timeout: 1, first_byte_timeout: 1, "
                "total_timeout: 2}\n")
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": "http://s3.never-answers.test:9000",
           "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    in_namespace = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv)]
    build = subprocess.Popen([*in_namespace, sys.executable, "-m", "tpubuild", "build", "--json", "toy"], cwd=ws,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        document = build.stdout.read(1)  # the build prints its document when it is done
        printed = time.monotonic()
        document += build.stdout.read()
        stderr = build.stderr.read()
        build.wait(timeout=120)
        exited = time.monotonic()
    finally:
        build.kill()
        dns.close()
    assert build.returncode == 0, stderr
    assert dns.queries >= 1  # the resolver did ask it
    assert [line for line in stderr.splitlines() if line.startswith("remote cache")] == [
        f"remote cache s3://{BUCKET}/x unreachable: no complete answer within 2 s (remote_cache: total_timeout); "
        "building locally"], stderr
    assert [(r["stage"], r["status"]) for r in json.loads(document)["rows"]][:2] == [("source", "built"),
                                                                                      ("batch", "cached")]
    # Before issue 39 the process then waited for the resolver thread: the 30 s of its timeout.
    assert exited - printed < 5, (printed - start, exited - start)
    assert exited - start < 25
