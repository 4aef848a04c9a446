"""The dep files of a cache, `v1/discovered/ab/<key>.json` (a part of `Store`,
store/store.py): for a stage that discovers its inputs, the candidates (files -> hashes,
final key) engine/resolver.py chooses from. Read and written like the rest of the cache,
every directory opened without following a link (store/layout.py): a link or a special
file where one should be is never read through nor written through.
"""

from __future__ import annotations

from pathlib import Path

from tpubuild.fs import read_regular_at, write_atomic_at
from tpubuild.keys import RECORD_LIMIT
from tpubuild.store.layout import CacheLayout

__all__ = ["StoreDepFiles"]


class StoreDepFiles:
    """The dep-file part of `Store`; the state is made by `Store.__init__`."""

    root: Path
    layout: CacheLayout

    def dep_file(self, key: str) -> Path:
        """Where the dep file of `key` is (what messages about it name)."""
        return self.root / "discovered" / key[:2] / f"{key}.json"

    def read_dep_file(self, key: str) -> bytes | None:
        """The bytes of the dep file of `key`; None when there is none. Raises NotAFile (a
        link, a FIFO, a directory there: not followed, not waited on), another OSError, or
        ValueError when it is larger than a record may be: the caller says why it is not used."""
        try:
            with self.layout.at("discovered", key[:2], create=False) as shard:
                return read_regular_at(f"{key}.json", shard, RECORD_LIMIT)
        except FileNotFoundError:
            return None

    def write_dep_file(self, key: str, text: str) -> None:
        """Replace the dep file of `key` with `text`: atomic and durable, never through a
        link (one in its place is replaced, never followed); private to this user, as the
        dep files written before were."""
        with self.layout.at("discovered", key[:2]) as shard:
            write_atomic_at(f"{key}.json", shard, text.encode("utf-8"), 0o600)
