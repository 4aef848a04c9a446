"""The example workspace (this repository's tpubuild.yaml and recipes/) built cold while
pushing to a remote cache on an S3-protocol server (moto's, on 127.0.0.1), then a
second, fresh copy of the workspace built from that warm remote only (no local cache,
no outputs): the second build's time, the stages it ran, and the bytes each way.

Targets: the warm build at least 10x faster than the cold one, 0 stages built.
Needs `pip install -e '.[test]'` (moto[server], s3fs). Prints the figures; asserts nothing.
Usage: python3 benchmarks/remote_cache.py [JOBS]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"


def copy_workspace(dest: Path) -> Path:
    """tpubuild.yaml and recipes/ (models, data, lock files), nothing built."""
    dest.mkdir(parents=True)
    shutil.copy2(REPO / "tpubuild.yaml", dest / "tpubuild.yaml")
    shutil.copytree(REPO / "recipes", dest / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def timed_build(ws: Path, url: str, jobs: int, env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tpubuild", "build", "--json", "-j", str(jobs), "--remote-cache", url],
                         cwd=ws, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"build in {ws} failed ({out.returncode}):\n{out.stderr}")
    return seconds, json.loads(out.stdout)


def stages_built(doc: dict) -> int:
    return sum(1 for r in doc["rows"] if r["status"] == "built" and r["stage"] != "publish")


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    import boto3

    boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="bench",
                 aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)
    env = {**os.environ, "PYTHONPATH": str(REPO), **aws}
    url = f"s3://{BUCKET}/team"
    try:
        with tempfile.TemporaryDirectory(prefix="tpubuild-remote-bench-") as tmp:
            cold_s, cold = timed_build(copy_workspace(Path(tmp) / "first"), url, jobs, env)
            warm_s, warm = timed_build(copy_workspace(Path(tmp) / "second"), url, jobs, env)
    finally:
        server.stop()
    recipes = len({r["recipe"] for r in cold["rows"]})
    print(f"example workspace: {recipes} recipes, {len(cold['rows'])} stages, -j {jobs}, remote {url} (moto, 127.0.0.1)")
    print(f"cold build, pushing:        {cold_s:7.1f} s  ({stages_built(cold)} stages built, "
          f"{cold['remote']['uploads']} records and {cold['remote']['bytes_up'] / 2**20:.1f} MiB up)")
    print(f"fresh copy, warm remote:    {warm_s:7.1f} s  ({stages_built(warm)} stages built, "
          f"{warm['remote']['hits']} remote hits, {warm['remote']['misses']} misses, "
          f"{warm['remote']['bytes_down'] / 2**20:.1f} MiB down, {warm['remote']['bytes_up'] / 2**20:.1f} MiB up)")
    print(f"speed-up: {cold_s / warm_s:.1f}x (target >= 10x); stages built from the warm remote: "
          f"{stages_built(warm)} (target 0)")
    for failure in cold["remote"]["failures"] + warm["remote"]["failures"]:
        print(f"failure: {failure}")


if __name__ == "__main__":
    main()
