"""Content digests and the toolchain facts every key is made of: BLAKE3 of bytes, files and trees
(`hashing`), the stat cache that makes rehashing an unchanged file free (`statcache`), the
signatures of remote-cache records (`signing`), and the installed distributions, keyed and
unkeyed environment variables and the mark of a missing input (`toolchain_facts`). The
lowest layer of the build: it imports nothing of the engine, so config/, stages/, tpu/,
provenance/ and the worker process use it freely.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "ABSENT": "toolchain_facts",
    "CHUNK": "hashing",
    "ENV_ALLOWLIST": "toolchain_facts",
    "ENV_THREADS": "toolchain_facts",
    "FileEntry": "hashing",
    "SCHEME": "hashing",
    "SigningKeyError": "signing",
    "StatCache": "statcache",
    "current_input_hash": "toolchain_facts",
    "dist_input": "toolchain_facts",
    "forget_installed": "toolchain_facts",
    "hash_bytes": "hashing",
    "hash_fd": "hashing",
    "hash_fd_arriving": "hashing",
    "hash_file": "hashing",
    "installed_dist": "toolchain_facts",
    "is_racy": "statcache",
    "key_env": "toolchain_facts",
    "key_id": "signing",
    "load_public_key": "signing",
    "normalized_dist": "toolchain_facts",
    "problem": "signing",
    "sign": "signing",
    "signing_key_from_environment": "signing",
    "stat_key": "statcache",
    "toolchain": "toolchain_facts",
    "tree_digest": "hashing",
    "walk_files": "hashing",
    "worker_env": "toolchain_facts",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
