"""Restoring a cached 1 GiB artifact from the store: hardlinks, against a copy of it.
Target (issue 4): under 50 ms. Usage: python3 benchmarks/restore.py [SIZE_MIB]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tpubuild.engine.statcache import StatCache
from tpubuild.engine.store import Store
from tpubuild.engine.versions import publish

sys.path.insert(0, str(Path(__file__).parent))
from hashing import make_saved_model  # noqa: E402


def main(size_mib: int = 1024) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        store = Store(root / "cache")
        work = store.new_workdir("bench") / "out"
        make_saved_model(work.parent, size_mib).rename(work)
        entry = store.put("k" * 64, "bench", work, {}, [], {}, StatCache(None))
        files = [(f, store.object_path(f.hash)) for f in entry.files]
        start = time.perf_counter()
        checkout = store.checkout(entry)
        checkout_s = time.perf_counter() - start
        start = time.perf_counter()
        publish(root / "out" / "bench", files, {"content": entry.tree}, keep=None)
        publish_s = time.perf_counter() - start
        big = checkout / "variables" / "variables.data-00000-of-00001"
        start = time.perf_counter()
        shutil.copyfile(big, root / "copy")
        copy_s = time.perf_counter() - start
        print(f"restore of a cached {size_mib} MiB SavedModel ({len(files)} files)")
        print(f"  checkout from the store (hardlinks)        {checkout_s * 1000:.2f} ms (target < 50 ms)")
        print(f"  publish as out/<recipe>/1 with manifest   {publish_s * 1000:.2f} ms")
        print(f"  reference, same run: copying the big file  {copy_s * 1000:.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
