"""Stage keys: what a stage's output is a function of, hashed before the stage runs. The key
record and its digest (`stage`), the digest of the code a stage runs, its import closure
(`code`), and the stage record that ties a key to its output tree (`records`), checked the
same way whether it came from the local store or a remote cache.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
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
__getattr__, __dir__ = lazy(__name__, _FACE)
