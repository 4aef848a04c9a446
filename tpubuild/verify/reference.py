"""The source's outputs on verify's samples, computed beside the stages before verify.

verify compares the artifact's outputs with the source's on the same samples. The source's
side needs only the source and the samples, both there before the first transform runs,
and the transforms (tpu, bfloat16, io_shape: graph edits, mostly Python) run one at a time,
leaving a second core idle. So for a large source the engine (engine/beside.py) runs
stages/verify.py prefetch_reference in a worker of its own as soon as the source is in the store, and hands verify
its directory; verify then loads and runs only the artifact (BERT-base with
tensorflow_text, issue 48: verify 9.2 s -> see benchmarks/real_models.py).

verify takes these outputs only when they are for exactly the samples it drew itself, from
the same source directory (a store object: its bytes are its key's) with the same tags
(`take`); anything else, and any failure of the prefetch, and it runs the source itself as
before. Its verdict is the same either way: the same code on the same samples and model,
only in another process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tpubuild.atomic import replacing, write_atomic

if TYPE_CHECKING:
    from tpubuild.quantize.datasets import Sample

DONE = "reference.json"  # written last: its presence says the arrays are complete
ARRAYS = "reference.npz"
FAILED = "failed"  # written by the engine when the prefetch ended without DONE (engine/beside.py)
# Written by the engine once the prefetch's worker has exited (engine/beside.py): its
# memory, a loaded source, is the machine's again.
ENDED = "ended"
POLL_SECONDS = 0.05


def write(directory: Path, source_dir: Path, tags: list[str], sample_sets: list[dict[str, list[Sample]]],
          outputs: list[dict[str, dict[str, np.ndarray]]]) -> None:
    """What stages/verify.py prefetch_reference computed, for `take`: the arrays, then the
    description (DONE) last. ValueError for a string output (np.load would have to unpickle
    it: verify runs the source itself)."""
    if any(array.dtype.kind == "O" for produced in outputs for by_name in produced.values() for array in by_name.values()):
        raise ValueError("string outputs are not handed on (np.load would have to unpickle them)")
    arrays: dict[str, np.ndarray] = {}
    sets = []
    for i, (samples, produced) in enumerate(zip(sample_sets, outputs)):
        described = {}
        for key in sorted(samples):
            names = sorted(produced[key])
            described[key] = {"samples": samples_digest(samples[key]), "outputs": names}
            arrays.update({_array_name(i, key, name): produced[key][name] for name in names})
        sets.append(described)
    _save_npz(directory / ARRAYS, arrays)
    write_atomic(directory / DONE, json.dumps({"source": str(source_dir), "tags": list(tags), "sets": sets}).encode())


def wait_ended(directory: Path) -> None:
    """Until the prefetch's worker has exited: verify loads no model of its own while one
    beside still holds the source (issue 54: at 8 GiB the two overlapped, worker 8,915 MiB
    beside verify's serving-load check, 5,373 MiB). FAILED too says it has: the engine
    writes it only once the worker is gone."""
    while not (directory / ENDED).exists() and not (directory / FAILED).exists():
        time.sleep(POLL_SECONDS)


def take(directory: Path, source_dir: Path, tags: list[str], sample_sets: list[dict[str, list[Sample]]],
         log: Any) -> list[dict[str, dict[str, np.ndarray]]] | None:
    """The prefetched outputs for exactly `sample_sets` (verify's own samples), once the
    prefetch is done; None, said in the log, when it failed or holds anything else."""
    while not (directory / DONE).exists() and not (directory / FAILED).exists():
        time.sleep(POLL_SECONDS)  # the engine writes FAILED whenever the prefetch ends without DONE
    meta, why = _description(directory, source_dir, tags, sample_sets)
    if meta is None:
        log(f"the source's outputs computed beside the earlier stages are not used ({why}): the source runs here")
        return None
    with np.load(directory / ARRAYS, allow_pickle=False) as arrays:
        taken = [{key: {name: arrays[_array_name(i, key, name)] for name in meta["sets"][i][key]["outputs"]}
                  for key in samples} for i, samples in enumerate(sample_sets)]
    log("the source's outputs were computed beside the earlier stages")
    return taken


def _description(directory: Path, source_dir: Path, tags: list[str],
                 sample_sets: list[dict[str, list[Sample]]]) -> tuple[dict[str, Any] | None, str]:
    """(the prefetch's description, "") when it holds outputs for exactly `sample_sets` from
    `source_dir` with `tags`; else (None, why not)."""
    if (directory / FAILED).exists() or not (directory / DONE).exists():
        try:
            said = (directory / FAILED).read_text(errors="replace").strip().splitlines()[0][:300]
        except (OSError, IndexError):
            said = ""
        return None, f"it failed: {said}" if said else "it failed"
    try:
        meta = json.loads((directory / DONE).read_bytes())
    except (OSError, ValueError):
        return None, "its description cannot be read"
    if meta.get("source") != str(source_dir) or meta.get("tags") != list(tags):
        return None, "another source or other tags"
    sets = meta.get("sets") or []
    for i, samples in enumerate(sample_sets):
        for key, drawn in samples.items():
            done = sets[i].get(key) if i < len(sets) else None
            if done is None or done.get("samples") != samples_digest(drawn):
                return None, f"other samples for signature {key!r}"
    return meta, ""


def samples_digest(samples: list[Sample]) -> str:
    """The digest of a list of samples (input name -> array): names, dtypes, shapes and
    values; strings element by element (an object array's bytes are pointers)."""
    import blake3

    hasher = blake3.blake3()
    for sample in samples:
        hasher.update(b"sample\0")
        for name in sorted(sample):
            value = np.asarray(sample[name])
            hasher.update(json.dumps([name, value.dtype.str, list(value.shape)]).encode() + b"\0")
            if value.dtype.kind == "O":
                for element in value.reshape(-1):
                    data = element if isinstance(element, bytes) else str(element).encode() \
                        if isinstance(element, str) else repr(element).encode()
                    hasher.update(len(data).to_bytes(8, "little") + data)
            else:
                hasher.update(np.ascontiguousarray(value).tobytes())
    return hasher.hexdigest()


def _array_name(index: int, key: str, name: str) -> str:
    return json.dumps([index, key, name])


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez through atomic.replacing: a temporary name, fsync'ed, then renamed."""
    with replacing(path) as temporary, open(temporary, "xb") as f:
        np.savez(f, allow_pickle=False, **arrays)  # type: ignore[arg-type]  # numpy stubs type **kwds as its own keywords
        f.flush()
        os.fsync(f.fileno())
