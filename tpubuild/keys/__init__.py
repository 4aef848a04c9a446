"""Stage keys: what a stage's output is a function of, hashed before the stage runs. The key
record and its digest (`stage`), the digest of the code a stage runs, its import closure
(`code`), and the stage record that ties a key to its output tree (`records`), checked the
same way whether it came from the local store or a remote cache.
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.keys import name` to its module.
_FACE = {
    "DIGEST": "records",
    "PACKAGE_ROOT": "code",
    "RECORD_LIMIT": "records",
    "StageEntry": "records",
    "canonical_dumps": "stage",
    "closure": "code",
    "code_digest": "code",
    "code_digests": "code",
    "diff_records": "stage",
    "discovered_final_key": "records",
    "forget_code": "code",
    "key_record": "stage",
    "package_fingerprint": "code",
    "parse_candidate": "records",
    "parse_entry": "records",
    "planning_code_digest": "code",
    "stage_key": "stage",
    "summary_digest": "stage",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
