"""gc's view of a cache (a part of `Store`, store/store.py): every stage record and
checkout, read without following a link, damage removed; and their removal.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpubuild.fs import NotAFile, lstat_at, open_dir, open_regular_at, opened, remove_at
from tpubuild.keys import RECORD_LIMIT, parse_entry
from tpubuild.store.layout import CacheLayout

__all__ = ["StoreScan"]


class StoreScan:
    """The scan part of `Store`; the state is made by `Store.__init__`."""

    stages: Path
    trees: Path
    layout: CacheLayout

    def scan_records(self) -> tuple[list[tuple[float, str, set[str], str]], int]:
        """([(last used, key, object hashes, tree)], damaged): every stage record, read
        without following a link. A record that is not a regular file, cannot be read or is
        invalid is removed (its stage rebuilds, as `get` would) and counted in `damaged`."""
        entries: list[tuple[float, str, set[str], str]] = []
        damaged = 0
        try:
            stages_fd = self.layout.open(("stages",), create=False)
        except FileNotFoundError:
            return entries, damaged
        with opened(stages_fd):
            for sub in sorted(os.listdir(stages_fd)):
                try:
                    shard = open_dir(sub, stages_fd)
                except NotAFile as exc:
                    self.layout.remove_damage(sub, stages_fd, self.stages / sub, exc.kind)
                    continue
                except OSError:
                    continue
                with opened(shard):
                    for name in sorted(os.listdir(shard)):
                        if not name.endswith(".json") or name.startswith("."):
                            continue  # a temp file of an interrupted write
                        path, key = self.stages / sub / name, name[: -len(".json")]
                        try:
                            fd, st = open_regular_at(name, shard)
                            with opened(fd):
                                raw = os.read(fd, RECORD_LIMIT + 1)
                            entry, problem = parse_entry(key, raw, hash_record=False)
                        except NotAFile as exc:
                            entry, problem = None, exc.kind
                        except OSError as exc:
                            entry, problem = None, exc.strerror or str(exc)
                        if entry is None:
                            self.layout.say_once(path, f"warning: cache record {path} is invalid ({problem}); removed")
                            if remove_at(name, shard):
                                damaged += 1
                            continue
                        entries.append((st.st_mtime, key, {f.hash for f in entry.files}, entry.tree))
        return entries, damaged

    def remove_record(self, key: str) -> bool:
        """Remove the record of `key` (never through a link); True when one was removed."""
        try:
            with self.layout.at("stages", key[:2], create=False) as shard:
                if lstat_at(f"{key}.json", shard) is None:
                    return False
                return remove_at(f"{key}.json", shard)
        except FileNotFoundError:
            return False

    def tree_names(self) -> list[str]:
        try:
            with self.layout.at("trees", create=False) as trees_fd:
                return sorted(name for name in os.listdir(trees_fd) if not name.startswith("."))
        except FileNotFoundError:
            return []

    def remove_tree(self, name: str) -> None:
        """Remove the checkout `trees/<name>`: renamed away first (never half a checkout
        under its name), then deleted by descriptor, never through a link."""
        with self.layout.at("trees") as trees_fd:
            trash = f".trash-{os.getpid()}-{os.urandom(4).hex()}"
            try:
                os.rename(name, trash, src_dir_fd=trees_fd, dst_dir_fd=trees_fd)
            except OSError:
                trash = name
            remove_at(trash, trees_fd)
