"""Restoring a cached 1 GiB SavedModel from the store as a published version, in each
publishing mode, beside `cp` of the same files measured in the same run.

- copy (the default): a reflink where the file system supports it (FICLONE), else a
  kernel-side copy; every file fsynced and hashed (BLAKE3, checked against its object's
  name) before the version is renamed into place.
- hardlink (`link_type: hardlink`): links to the cache objects; no data is written, every
  file is hashed as a copy is.
- of which hashing: BLAKE3 of the published files again, the part of each mode above
  that checks what was written (fs/place.py place_file `expect`).
- `cp -r` of the checkout, then `sync -f`: what a copy costs with the same durability.
- the checkout of the tree inside the store (hard links; what the next stage reads).

Usage: python3 benchmarks/restore.py [SIZE_MIB]   (BENCH_DIR: where to write; put it on
btrfs or XFS to see reflinks)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpubuild.digests import StatCache, hash_file
from tpubuild.fs import place_file
from tpubuild.publish import publish
from tpubuild.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from hashing import make_saved_model  # noqa: E402


def _timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _flush(root: Path) -> None:
    """Write back dirty pages first, so one measurement does not pay for the previous one."""
    subprocess.run(["sync", "-f", str(root)], check=True)


def main(size_mib: int = 1024) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        store = Store(root / "cache")
        work = store.new_workdir("bench") / "out"
        make_saved_model(work.parent, size_mib).rename(work)
        entry = store.put("k" * 64, "bench", work, {}, [], {}, StatCache(None))
        files = [(f, store.object_path(f.hash)) for f in entry.files]
        manifest = {"recipe": "bench", "content": entry.tree, "files": {f.path: f.hash for f in entry.files}}
        probe_src, probe_dst = files[0][1], root / "probe"
        how = place_file(probe_src, probe_dst, "copy")
        _flush(root)
        checkout_s = _timed(lambda: store.checkout(entry))
        figures = {}
        for mode in ("copy", "hardlink"):
            _flush(root)
            figures[mode] = _timed(lambda: publish(root / "out" / mode, files, manifest, None, link_type=mode))
        hashed_s = _timed(lambda: [hash_file(root / "out" / "copy" / "1" / f.path) for f, _ in files])
        _flush(root)
        checkout = store.trees / entry.tree
        cp_s = _timed(lambda: (subprocess.run(["cp", "-r", str(checkout), str(root / "cp")], check=True),
                               subprocess.run(["sync", "-f", str(root / "cp")], check=True)))
        store.close()
        print(f"restore of a cached {size_mib} MiB SavedModel ({len(files)} files) as out/<recipe>/1, same run")
        print(f"  link_type: copy ({how} on this file system, fsynced)  {figures['copy'] * 1000:9.1f} ms")
        print(f"  link_type: hardlink (shares the cache's inodes)    {figures['hardlink'] * 1000:9.1f} ms")
        print(f"  of which hashing what was written (BLAKE3)        {hashed_s * 1000:9.1f} ms")
        print(f"  reference: cp -r + sync -f                         {cp_s * 1000:9.1f} ms")
        print(f"  checkout inside the store (hard links)             {checkout_s * 1000:9.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
