"""The example workspace built cold with `--executor ray` on a local Ray cluster, beside a
cold local `-j 2` build, in the same run; prints both times and whether the lock files
are identical.

The cluster is a head node on this machine with 2 CPUs (tests/ray/cluster.py) and the
remote cache a `file://` directory, so the figures show the executor's overhead (Ray
tasks, uploads and verified downloads of every input and output) rather than any gain:
on a real cluster the stages of different recipes run on different hosts.
Prints the figures; asserts nothing.
Usage: python3 benchmarks/ray_build.py [RECIPE...]   (default: every example recipe)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ray.cluster import local_cluster  # noqa: E402


def example_copy(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copy(REPO / "tpubuild.yaml", root)
    shutil.copytree(REPO / "recipes", root / "recipes")
    return root


def timed_build(root: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tpubuild", "build", "-j", "2", *args], cwd=root,
                            capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = result.stdout.strip().splitlines()
    summary = next((line for line in lines if " recipe" in line and ":" in line), "")
    if result.returncode != 0:
        summary += f" (exit {result.returncode}: {result.stderr.strip().splitlines()[-1:]})"
    return seconds, summary


def main(targets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        local_ws = example_copy(base / "local")
        ray_ws = example_copy(base / "ray")
        remote = base / "remote"
        remote.mkdir()
        start = time.perf_counter()
        with local_cluster(num_cpus=2) as address:
            print(f"local Ray cluster (2 CPUs) started in {time.perf_counter() - start:.1f} s")
            ray_seconds, ray_summary = timed_build(ray_ws, "--executor", "ray", "--ray-address", address,
                                                   "--remote-cache", remote.as_uri(), *targets)
            print(f"cold build, --executor ray (-j 2): {ray_seconds:.1f} s  [{ray_summary}]")
        local_seconds, local_summary = timed_build(local_ws, *targets)
        print(f"cold build, local -j 2:            {local_seconds:.1f} s  [{local_summary}]")
        print(f"ray / local: {ray_seconds / local_seconds:.2f}x")
        locks = sorted(p.name for p in (local_ws / "recipes").glob("*.lock.yaml"))
        differ = [name for name in locks
                  if (local_ws / "recipes" / name).read_text() != (ray_ws / "recipes" / name).read_text()]
        print(f"lock files identical: {len(locks) - len(differ)} of {len(locks)}"
              + (f" (differ: {', '.join(differ)})" if differ else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
