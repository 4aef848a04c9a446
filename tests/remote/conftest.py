"""Remote cache tests: a real S3-protocol server (moto's threaded server) on 127.0.0.1,
real builds through the CLI in real processes, talking to it over HTTP.

One workspace is built per session and pushed to `s3://cache/shared`; each test that
changes the remote copies that prefix to its own, so tests never see each other's
changes."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import (
    BUILT_RECIPES,
    tiny_saved_model,  # noqa: F401 (a session fixture, shared with this directory)
    write_workspace,
)

BUCKET = "cache"
SHARED = f"s3://{BUCKET}/shared"
RECIPES = {"toy": BUILT_RECIPES["toy"], "cut": BUILT_RECIPES["cut"]}


@dataclass
class S3:
    env: dict[str, str]
    client: Any  # boto3 S3 client of the test process

    def keys(self, prefix: str) -> dict[str, bytes]:
        """Every object under `prefix/` -> its content."""
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                out[item["Key"]] = self.client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        return out

    def record(self, prefix: str, key: str) -> dict[str, Any]:
        """The stage record stored under `key` in the remote at `prefix`."""
        body = self.client.get_object(Bucket=BUCKET, Key=f"{prefix}/v1/stages/{key[:2]}/{key}.json")["Body"]
        return json.loads(body.read())

    def copy_prefix(self, src: str, dst: str, without: tuple[str, ...] = ()) -> str:
        """A copy of the remote at `src` (a prefix of the bucket) under `dst`, less the
        stage records `without`; its URL. A build from a copy without the `source`
        record snapshots the model again (no TensorFlow) and takes the rest from it."""
        dropped = {f"{src}/v1/stages/{key[:2]}/{key}.json" for key in without}
        for key, data in self.keys(src).items():
            if key not in dropped:
                self.client.put_object(Bucket=BUCKET, Key=dst + key[len(src):], Body=data)
        return f"s3://{BUCKET}/{dst}"


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> S3:
    """moto's S3 server on a free port of 127.0.0.1 and the environment that points the
    CLI at it (credentials from AWS_* variables only, as in production)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    nowhere = tmp_path_factory.mktemp("aws") / "none"  # no ~/.aws of the machine's user
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_CONFIG_FILE": str(nowhere),
        "AWS_SHARED_CREDENTIALS_FILE": str(nowhere),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    yield S3(env, client)
    server.stop()


def build_remote(ws: Path, s3: S3 | None, *args: str, expect: int = 0, env: dict | None = None) -> tuple[dict, str]:
    """`tpubuild build --json ARGS` (against the server with `s3`): (document, stderr)."""
    result = tpubuild(ws, "build", "--json", *args, env={**(s3.env if s3 else {}), **(env or {})})
    assert result.returncode == expect, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.fixture(scope="session")
def pushed(tmp_path_factory, tiny_saved_model, s3) -> tuple[Path, dict]:  # noqa: F811 (the fixture)
    """RECIPES built once per session, cold, pushing to SHARED; the --json document."""
    ws = write_workspace(tmp_path_factory.mktemp("pushed") / "ws", tiny_saved_model, RECIPES)
    doc, _ = build_remote(ws, s3, "-j", "2", "--remote-cache", SHARED)
    return ws, doc


@pytest.fixture
def fresh(tmp_path, tiny_saved_model):  # noqa: F811 (the fixture)
    """A new, unbuilt workspace (sharing nothing with another: its own cache, outputs)."""

    def make(name: str, recipes: dict[str, str] | None = None) -> Path:
        return write_workspace(tmp_path / name, tiny_saved_model, recipes or RECIPES)

    return make


def published(ws: Path) -> dict[str, bytes]:
    """Every published file -> bytes, with the manifest's creation time left out (the one
    field a second build writes anew, and so the provenance's subject that is the manifest)
    and the provenance's remote cache URL (each test builds against its own copy of the
    remote)."""
    out = {}
    for path in sorted((ws / "out").rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "tpubuild-manifest.json":
                manifest = json.loads(data)
                manifest.pop("created")
                data = json.dumps(manifest, sort_keys=True).encode()
            if path.name == "tpubuild-provenance.json":
                statement = json.loads(data)
                statement["predicate"]["buildDefinition"]["internalParameters"].pop("remoteCache")
                # The manifest is a subject: its digest covers the creation time left out above.
                statement["subject"] = [s for s in statement["subject"] if s["name"] != "tpubuild-manifest.json"]
                data = json.dumps(statement, sort_keys=True).encode()
            out[path.relative_to(ws).as_posix()] = data
    return out


def lock_files(ws: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ws / "recipes").glob("*.lock.yaml"))}


def stage_keys(doc: dict, recipe: str | None = None) -> dict[tuple[str, str], str]:
    """(recipe, stage) -> key of every stored stage (publish is not stored)."""
    return {(r["recipe"], r["stage"]): r["key"] for r in doc["rows"]
            if r["stage"] != "publish" and (recipe is None or r["recipe"] == recipe)}


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def env_without_endpoint() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
