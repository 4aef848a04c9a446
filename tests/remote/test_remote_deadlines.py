"""A remote that answers too slowly, or too much: every call has deadlines, and no
download reads more than its record says (transport/backends.py)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.remote.conftest import BUCKET, build_remote, copy_tree, stage_keys

HEADERS = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nContent-Type: application/xml\r\n\r\n"


class _Server:
    """A TCP server on 127.0.0.1 that accepts every connection, then either never
    answers (`trickle` None) or sends a valid-looking HTTP answer one byte every
    `trickle` seconds (each read is quick: only the total deadline can stop it)."""

    def __init__(self, trickle: float | None):
        self.trickle = trickle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            if self.trickle is not None:
                threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        for byte in HEADERS + b"<" * 1000000:
            if self.stop.wait(self.trickle):
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        for conn in [self.sock, *self.conns]:
            conn.close()


@pytest.mark.parametrize("trickle", [None, 0.2], ids=["silent", "trickling"])
def test_a_remote_that_never_answers_or_trickles_costs_seconds(pushed, s3, tmp_path, trickle):
    first, cold = pushed
    server = _Server(trickle)
    try:
        ws = copy_tree(first, tmp_path / "ws")
        source = stage_keys(cold)[("toy", "source")]
        (ws / ".tpubuild/cache/v1/stages" / source[:2] / f"{source}.json").unlink()  # a local miss: asks the remote
        with open(ws / "tpubuild.yaml", "a") as f:
            f.write(f"remote_cache: {{url: 's3://{BUCKET}/x', first_byte_timeout: 1, total_timeout: 2}}\n")
        start = time.monotonic()
        doc, stderr = build_remote(ws, s3, "toy", env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}"})
        elapsed = time.monotonic() - start
    finally:
        server.close()
    assert server.accepted >= 1, (doc, stderr)  # it did reach the server
    # Without deadlines: ~930 s (silent), forever (trickling). The build's own work
    # here (snapshot one SavedModel, the rest cached) takes a few seconds.
    assert elapsed < 40, elapsed
    assert [(r["stage"], r["status"]) for r in doc["rows"]][:2] == [("source", "built"), ("batch", "cached")]
    lines = [line for line in stderr.splitlines() if line.startswith("remote cache")]
    assert lines == [f"remote cache s3://{BUCKET}/x unreachable: no complete answer within 2 s "
                     "(remote_cache: total_timeout); building locally"], stderr
    assert doc["exit_code"] == 0 and doc["remote"]["failures"] == lines


def test_the_timeouts_are_read_from_the_workspace_file(tmp_path):
    from tpubuild.config.remote_url import Timeouts
    from tpubuild.config.workspace import load_workspace
    from tpubuild.errors import ConfigError

    (tmp_path / "tpubuild.yaml").write_text("remote_cache: {url: 's3://b/c', connect_timeout: 2.5}\n")
    assert load_workspace(override=tmp_path).remote_timeouts == Timeouts(connect=2.5)
    (tmp_path / "tpubuild.yaml").write_text("remote_cache: s3://b/c\n")
    assert load_workspace(override=tmp_path).remote_timeouts == Timeouts(connect=5, first_byte=10, total=30)
    (tmp_path / "tpubuild.yaml").write_text("remote_cache: {url: 's3://b/c', total_timeout: 0}\n")
    with pytest.raises(ConfigError, match="total_timeout"):
        load_workspace(override=tmp_path)


def _wchar() -> int:
    """Bytes this process has written (files, sockets): the moto server runs in it, so
    this counts what it sent to the build."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def test_an_object_larger_than_its_record_says_is_refused_unread(pushed, s3, fresh):
    from tests.engine.conftest import source_recipe

    first, cold = pushed
    url = s3.copy_prefix("shared", "padded")
    source_key = stage_keys(cold, "toy")[("toy", "source")]
    record = s3.record("padded", source_key)
    path, digest, size = next(f for f in record["files"] if f[0] == "saved_model.pb")
    big = 20 << 20
    s3.client.put_object(Bucket=BUCKET, Key=f"padded/v1/objects/{digest[:2]}/{digest[2:]}", Body=b"\0" * big)
    ws = fresh("padded", {"toy": source_recipe("toy")})
    before = _wchar()
    doc, stderr = build_remote(ws, s3, "--remote-cache", url, "--remote-cache-read-only")
    sent = _wchar() - before
    # What the server sent: the other records and objects of a tiny model (KiBs), never
    # the 20 MiB: the object's size was seen (a HEAD) and refused before any GET.
    assert sent < big // 4, sent
    assert doc["remote"]["bytes_down"] < big // 4
    assert f"remote cache {url}: object {digest} of stage record {source_key} is padded ({big} bytes, " \
           f"expected {size}; not read); not used" in stderr.splitlines()
    rows = {r["stage"]: (r["status"], r["remote"]) for r in doc["rows"]}
    assert rows["source"] == ("built", False), stderr  # built here instead
    assert doc["exit_code"] == 0
