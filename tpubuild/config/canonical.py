"""The canonical form of a recipe: one JSON document per meaning (docs/architecture.md).

Two recipes that mean the same thing (key order, comments, enum case, a default spelled
out or left implicit, `extends` vs inline) produce the same document and the same hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tpubuild.config.checks import (
    DEFAULT_SIGNATURE_KEYS,
    expand_globs,
    generator_module_file,
)
from tpubuild.pipeline import target

BATCH_DEFAULTS = {
    "num_batch_threads": 1,
    "batch_timeout_micros": 0,
    "allowed_batch_sizes": [],
    "max_enqueued_batches": 10,
    "disable_large_batch_splitting": False,
}
VERIFY_DEFAULTS: dict[str, Any] = {"samples": 32, "seed": 0, "rtol": None, "atol": None, "representative_datasets": {}}
DEFAULT_TAGS = ["serve"]
DEFAULT_NUM_SAMPLES = 200
WARMUP_MAX_RECORDS = 1000  # TF Serving's limit (serving/warmup.py)


def canonicalize(data: dict[str, Any], name: str, root: Path) -> dict[str, Any]:
    """`data` has passed schema and semantic checks; paths are root-relative."""
    model = data["model"]
    tags = list(model.get("tags", DEFAULT_TAGS))
    canonical_model: dict[str, Any] = {"tags": tags}
    if "saved_model" in model:
        canonical_model["saved_model"] = model["saved_model"]
    else:
        export = model["export"]
        canonical_model["export"] = {
            "script": export["script"],
            "function": export.get("function", "export"),
            "deps": list(expand_globs(export.get("deps", []), root)),
        }
    return {
        "name": name,
        "model": canonical_model,
        "converter": _converter(data.get("converter", {}), tags, root),
        "verify": {**VERIFY_DEFAULTS, **data.get("verify", {})},
        **_targets(data.get("targets") or {}),
        # Present only when set: recipes without custom ops keep their canonical form.
        **({"op_libraries": list(data["op_libraries"])} if data.get("op_libraries") else {}),
        # Present only when the recipe has a `warmup:` section (which turns it on).
        **({"warmup": {"enabled": True, "max_records": WARMUP_MAX_RECORDS, **data["warmup"]}}
           if "warmup" in data else {}),
        # Present only when set (the reshard stage runs then): the size in bytes.
        **({"variables": {"max_shard_size": _bytes(data["variables"]["max_shard_size"])}}
           if (data.get("variables") or {}).get("max_shard_size") is not None else {}),
    }


def _bytes(value: int | str) -> int:
    """`1GiB`, `512MiB` or a number of bytes -> bytes: spellings of one size canonicalize alike."""
    from tpubuild.config.sizes import parse_size

    return value if isinstance(value, int) else parse_size(value)


def _targets(targets: dict[str, Any]) -> dict[str, Any]:
    """`targets`, defaults filled, every target after the always-built TPU SavedModel.
    The TPU SavedModel alone (absent or `{tpu_savedmodel: {}}`) is the default and leaves
    the key out, so recipes without other targets keep their canonical form and digest."""
    extra = {name: _target(name, options or {}) for name, options in targets.items() if name != "tpu_savedmodel"}
    if not extra:
        return {}
    return {"targets": {"tpu_savedmodel": {}, **dict(sorted(extra.items()))}}


def _target(name: str, options: dict[str, Any]) -> dict[str, Any]:
    out = {**target(name).defaults, **options}
    for key in ("signatures", "batch_sizes"):  # sets: their order means nothing
        if isinstance(out.get(key), list):
            out[key] = sorted(set(out[key]))
    if isinstance(out.get("composites"), list):
        out["composites"] = sorted(set(out["composites"]))
    return out


def _converter(converter: dict[str, Any], tags: list[str], root: Path) -> dict[str, Any]:
    bf16 = converter.get("bfloat16_optimization_options", {})
    scope = bf16.get("scope", "DEFAULT").upper()
    out: dict[str, Any] = {
        "tpu_functions": [_tpu_function(entry) for entry in converter.get("tpu_functions", [])],
        "batch_options": [_batch(entry) for entry in converter.get("batch_options", [])],
        "io_shape_optimization": converter.get("io_shape_optimization", "DEFAULT").upper(),
        "bfloat16_optimization": converter.get("bfloat16_optimization", "DEFAULT").upper(),
        "disable_default_optimizations": converter.get("disable_default_optimizations", False),
        "bfloat16_optimization_options": {
            "scope": "TPU" if scope == "DEFAULT" else scope,
            "skip_safety_checks": bf16.get("skip_safety_checks", False),
            "filterlist": sorted(set(bf16.get("filterlist", []))),
        },
    }
    # ConverterOptionsV2's fields, present only when set (recipes without them keep their
    # keys); preserve_signature and convert_checkpoint are implied by scope ALL (render
    # writes them), so they are not kept.
    if converter.get("enable_device_placement_safety_checks"):
        out["enable_device_placement_safety_checks"] = True
    if (converter.get("experimental_options") or {}).get("graph_pruning"):
        out["experimental_options"] = {"graph_pruning": converter["experimental_options"]["graph_pruning"].upper()}
    if "xla_sharding_options" in converter:
        xla = converter["xla_sharding_options"]
        out["xla_sharding_options"] = {
            "num_cores_per_replica": xla.get("num_cores_per_replica", 1),
            "device_assignment": list(xla.get("device_assignment", [])),
            **({"topology": dict(xla["topology"])} if "topology" in xla else {}),
        }
    if "quantization_options" in converter:
        quant = converter["quantization_options"]
        out["quantization_options"] = {
            "method": quant.get("method", "STATIC_RANGE").upper(),
            "tags": list(quant.get("tags", tags)),
            "signature_keys": list(quant.get("signature_keys", DEFAULT_SIGNATURE_KEYS)),
            "op_set": quant.get("op_set", "XLA").upper(),
            "representative_datasets": {
                key: _dataset(source, root) for key, source in quant.get("representative_datasets", {}).items()
            },
            # Present only when set, so recipes without it keep their keys.
            **({"unit_wise_quantization_specs": [_unit_spec(spec) for spec in quant["unit_wise_quantization_specs"]]}
               if quant.get("unit_wise_quantization_specs") else {}),
            # A tpubuild extension (render leaves it out): present only when set.
            **({"allow_unquantized": True} if quant.get("allow_unquantized") else {}),
        }
    return out


def _unit_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A unit-wise quantization spec with its method spelled once (NO_QUANTIZE, the default)."""
    units = [{k: unit[k] for k in ("op_type", "node_name", "func_name") if k in unit} for unit in spec["unit"]]
    return {"unit": units, "method": spec.get("method", "NO_QUANTIZE").upper()}


def _tpu_function(entry: dict[str, Any]) -> dict[str, Any]:
    """A TPU function entry; `enable_soft_device_placement` only when true, so an entry
    without soft placement keeps the form (and keys) it had before the field existed."""
    out = {k: v for k, v in entry.items() if k != "enable_soft_device_placement"}
    if entry.get("enable_soft_device_placement"):
        out["enable_soft_device_placement"] = True
    return out


def _batch(entry: dict[str, Any]) -> dict[str, Any]:
    return {**BATCH_DEFAULTS, **entry}


def _dataset(source: dict[str, Any], root: Path) -> dict[str, Any]:
    if "generator" in source:
        return {
            "generator": source["generator"],
            "num_samples": source.get("num_samples", DEFAULT_NUM_SAMPLES),
            "module_file": generator_module_file(source["generator"]),
            # Data files the generator reads: present only when declared, so recipes
            # without them keep their canonical form (and keys).
            **({"deps": list(expand_globs(source["deps"], root))} if source.get("deps") else {}),
        }
    return dict(source)


def canonical_json(canonical: dict[str, Any]) -> str:
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(canonical: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(canonical).encode()).hexdigest()
