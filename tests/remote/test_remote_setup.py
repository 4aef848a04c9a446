"""Configuring the remote cache, a file:// remote, what planning never loads, and what
a downloaded record must be before it is used."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPO, tpubuild
from tests.engine.conftest import source_recipe
from tests.remote.conftest import (
    build_remote,
    copy_tree,
    lock_files,
    published,
    stage_keys,
)


def test_credentials_in_the_workspace_file_are_an_error_at_their_line(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\nremote_cache: s3://AKIAEXAMPLE:s3cr3t@bucket/cache\n')
    result = tpubuild(ws, "validate")
    assert result.returncode == 2
    assert result.stderr.startswith("tpubuild.yaml:2:15: remote_cache: the URL holds credentials")
    assert len(result.stderr.splitlines()) == 1 and "s3cr3t" not in result.stderr
    (ws / "tpubuild.yaml").write_text("remote_cache:\n  push: false\n  url: gs://b/c?X-Goog-Signature=abc\n")
    result = tpubuild(ws, "validate")
    assert result.returncode == 2
    assert result.stderr.startswith("tpubuild.yaml:3:8: remote_cache.url: the URL holds key material")


def test_the_remote_setting_from_the_file_and_the_command_line(tmp_path):
    from tpubuild.commands._common import remote_setting
    from tpubuild.config.workspace import load_workspace
    from tpubuild.errors import UsageError

    (tmp_path / "tpubuild.yaml").write_text("remote_cache: {url: 's3://team/cache', push: false}\n")
    ws = load_workspace(override=tmp_path)
    assert (ws.remote_cache, ws.remote_push) == ("s3://team/cache", False)
    assert remote_setting(ws, None, False) == ("s3://team/cache", False)
    assert remote_setting(ws, "file:///shared/cache", False) == ("file:///shared/cache", True)
    assert remote_setting(ws, "file:///shared/cache", True) == ("file:///shared/cache", False)
    with pytest.raises(UsageError, match="--remote-cache: 'ftp://x/y': the ftp:// scheme is not supported"):
        remote_setting(ws, "ftp://x/y", False)
    (tmp_path / "tpubuild.yaml").write_text("remote_cache: s3://team/cache\n")
    ws = load_workspace(override=tmp_path)
    assert remote_setting(ws, None, True) == ("s3://team/cache", False)


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="the gs:// backend is installed")
def test_a_missing_backend_names_the_extra_to_install(fresh):
    ws = fresh("nogcs", {"toy": source_recipe("toy")})
    result = tpubuild(ws, "build", "--remote-cache", "gs://bucket/cache")
    assert result.returncode == 1
    assert result.stderr == ("error: remote cache gs://bucket/cache: the gs:// backend needs gcsfs "
                             "(pip install 'tpubuild[remote]')\n")


def test_a_file_remote_serves_a_fresh_workspace_and_is_create_only(pushed, fresh, tmp_path):
    """Records pushed through the API into a shared directory; a fresh workspace then
    builds nothing; a second push leaves each record as it was."""
    from tpubuild.remote import RemoteCache, push_entry
    from tpubuild.store import Store

    first, cold = pushed
    shared = tmp_path / "shared"
    url = f"file://{shared}"
    store = Store(first / ".tpubuild" / "cache")
    remote = RemoteCache(url)
    entries = [store.get(key) for key in sorted(set(stage_keys(cold).values()))]
    assert all(push_entry(remote, entry, store) for entry in entries)
    assert remote.stats.uploads == len(entries) and remote.stats.failures == []
    records = {p: p.read_bytes() for p in (shared / "v1" / "stages").rglob("*.json")}
    again = RemoteCache(url)
    assert all(push_entry(again, entry, store) for entry in entries)
    assert again.stats.uploads == 0 and again.stats.bytes_up == 0
    assert {p: p.read_bytes() for p in records} == records
    assert list((shared / "v1" / "discovered").rglob("*.json"))  # the export's discovered inputs
    store.close()
    assert not [p for p in shared.rglob(".*")], "a temp file was left behind"
    ws = fresh("fromfile")
    doc, stderr = build_remote(ws, None, "--remote-cache", url)
    assert {(r["status"], r["remote"]) for r in doc["rows"] if r["stage"] != "publish"} == {("cached", True)}, stderr
    assert doc["remote"]["hits"] == len(stage_keys(doc)) and doc["remote"]["uploads"] == 0
    assert published(ws) == published(first) and lock_files(ws) == lock_files(first)


def test_planning_and_no_op_builds_never_load_the_remote_backends(pushed, s3, tmp_path):
    first, _ = pushed
    ws = copy_tree(first, tmp_path / "ws")
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write("remote_cache: s3://cache/shared\n")
    code = (
        "import sys\nfrom tpubuild.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('EXIT', code, sorted(m for m in ('fsspec', 's3fs', 'botocore', 'tensorflow') if m in sys.modules))\n"
    )
    for args in (["build"], ["build"], ["build", "--dry-run"], ["build", "--check"], ["explain", "toy"]):
        out = subprocess.run([sys.executable, "-c", code, *args], cwd=ws, capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONPATH": str(REPO), **s3.env})
        assert out.stdout.strip().splitlines()[-1] == "EXIT 0 []", (args, out.stdout, out.stderr)


def _entry_bytes(store_dir: Path, key: str) -> dict:
    return json.loads((store_dir / "v1" / "stages" / key[:2] / f"{key}.json").read_text())


def test_a_downloaded_record_is_checked_before_use(pushed):
    from tpubuild.digests import tree_digest
    from tpubuild.keys import StageEntry, parse_entry

    first, cold = pushed
    key = stage_keys(cold)[("toy", "source")]
    export = stage_keys(cold)[("cut", "export")]
    good = _entry_bytes(first / ".tpubuild" / "cache", key)
    assert parse_entry(key, json.dumps(good).encode())[0] is not None
    assert parse_entry(export, json.dumps(_entry_bytes(first / ".tpubuild" / "cache", export)).encode())[0] is not None

    def problem(data: dict, under: str = key) -> str:
        entry, why = parse_entry(under, json.dumps(data).encode())
        assert entry is None
        return why

    assert problem(good, export).startswith("it names the key")
    assert problem({**good, "record": {**good["record"], "options": {"saved_model": "elsewhere"}}}) == \
        "its key record does not hash to its key"
    escape = [["../../outside", *good["files"][0][1:]], *good["files"][1:]]
    entry = StageEntry.from_json({**good, "files": escape})
    tree = tree_digest(entry.files)
    assert problem({**good, "files": escape, "tree": tree}) == "unsafe path '../../outside'"
    assert problem({**good, "tree": "0" * 64}) == "its tree hash is not its files'"
    assert problem({**good, "files": [[good["files"][0][0], "../x", 1]]}).startswith("bad object entry")
    assert parse_entry(key, b"{not json")[0] is None


def test_the_documented_example_is_a_valid_workspace_file(tmp_path):
    import re

    from tpubuild.config.workspace import load_workspace

    page = (REPO / "docs" / "remote-cache.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", page, re.DOTALL).group(1)
    (tmp_path / "tpubuild.yaml").write_text(example)
    ws = load_workspace(override=tmp_path)
    assert (ws.remote_cache, ws.remote_push) == ("s3://ml-build-cache/tpubuild", True)
    (tmp_path / "tpubuild.yaml").write_text(example.split("# or: ", 1)[1])
    ws = load_workspace(override=tmp_path)
    assert (ws.remote_cache, ws.remote_push) == ("s3://ml-build-cache/tpubuild", False)
