"""Stage `litert`: the float source SavedModel as one LiteRT flatbuffer, composites fused.

TensorFlow's converter (tf.lite.TFLiteConverter.from_saved_model) turns every selected
signature into one `model.tflite` (LiteRT's multi-signature flatbuffer: one SignatureDef
per key, each runnable by its own signature runner). Functions annotated as composites
(`experimental_implements`, Keras-style `api_implements`) become single fused ops
(targets/litert/composites.py says which and how); `composites` picks which are kept.
`quantization` is the converter's post-training mode: int8 calibrates on the recipe's
representative datasets. Writes `model.tflite` and `litert.json` (ops by count, composites
and whether each was fused, size): deterministic files only.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, SOURCE, StageContext, StageResult, StageSpec

MODEL_FILE = "model.tflite"
FACTS_FILE = "litert.json"
def target_options(recipe: dict[str, Any]) -> dict[str, Any]:
    """`targets.litert` of the canonical recipe (defaults filled by config/canonical.py)."""
    return slices.targets(recipe)["litert"]


def calibration_datasets(recipe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """int8's representative datasets: the quantization's, else verify's (per signature)."""
    return {**recipe["verify"].get("representative_datasets", {}), **slices.dataset_sources(recipe)}


def _options(recipe: dict[str, Any]) -> dict[str, Any]:
    target = target_options(recipe)
    options = {"tags": slices.tags(recipe), **{k: target[k] for k in ("quantization", "composites", "select_tf_ops", "signatures")}}
    if target["quantization"] == "int8":
        # Only int8 reads datasets: other modes are not rebuilt when a dataset changes.
        options["representative_datasets"] = calibration_datasets(recipe)
    return options


SPEC = StageSpec(
    "litert",
    runs_models=True,
    options=_options,
    files=lambda r: slices.tfrecord_files(_options(r).get("representative_datasets", {})),
    consumes=(SOURCE, DATASET),
    # int8 scales come from float calibration runs, whose last digits differ between CPUs.
    machine_dependent=lambda options: options["quantization"] == "int8",
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.targets.litert import composites as litert_composites
    from tpubuild.targets.litert import convert as litert_convert

    source_dir = context.inputs["source"]
    tags = options["tags"]
    if options["quantization"] not in litert_convert.QUANTIZATIONS:
        raise StageError(f"targets.litert.quantization: {options['quantization']!r} is not one of "
                         f"{', '.join(litert_convert.QUANTIZATIONS)}")
    model = SavedModel.load(source_dir, tags)
    keys = _signature_keys(model, options["signatures"], INIT_OP_KEY)
    found = litert_composites.composites(model, keys)
    kept = litert_composites.kept_composites(found, options["composites"])
    dropped = [c for c in found if c not in kept]
    representative = _representative(model, keys, options, context) if options["quantization"] == "int8" else None
    with tempfile.TemporaryDirectory(prefix=".litert-", dir=output_dir) as scratch:
        # The converter freezes variables in a session: one handle per weight
        # (savedmodel/variable_handles.py; `model` was merged on load).
        converted_from = source_dir if not model.merged_handles else None
        if dropped or converted_from is None:
            # A copy without the dropped composites' annotations (variables are hard links).
            if dropped:
                litert_composites.strip_composites(model, dropped)
            converted_from = Path(scratch) / "source"
            converted_from.mkdir()
            model.save(converted_from)
        flatbuffer = litert_convert.convert(
            converted_from, tags, keys, options["quantization"], options["select_tf_ops"], representative)
    facts = _facts(flatbuffer, found, kept, options)
    _refuse_unfrozen_weights(facts["ops"])
    warnings = _warnings(facts)
    write_atomic(output_dir / MODEL_FILE, flatbuffer)
    write_atomic(output_dir / FACTS_FILE, (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode())
    for message in warnings:
        context.log(f"warning: {message}")
    return StageResult(summary=facts, warnings=warnings)


def _facts(flatbuffer: bytes, found: list[Any], kept: list[Any], options: dict[str, Any]) -> dict[str, Any]:
    """litert.json: what the flatbuffer holds, and what became of each composite."""
    from tpubuild.targets.litert import flatbuffer as litert_inspect

    ops = litert_inspect.op_counts(flatbuffer)
    composites = [{**c.to_json(), "kept": c in kept, "fused": c in kept and c.fused_op in ops} for c in found]
    return {
        "file": MODEL_FILE,
        "size": len(flatbuffer),
        "signatures": litert_inspect.signature_keys(flatbuffer),
        "quantization": options["quantization"],
        "select_tf_ops": options["select_tf_ops"],
        "ops": ops,
        "op_count": sum(ops.values()),
        "flex_ops": litert_inspect.flex_ops(ops),
        "variable_tensors": litert_inspect.variable_tensors(flatbuffer),
        "composites": composites,
        "fused": sorted(c["name"] for c in composites if c["fused"]),
    }


# LiteRT's resource-variable builtins (tensorflow/lite/schema/schema.fbs BuiltinOperator;
# kernels in tensorflow/lite/kernels/var_handle.cc, read_variable.cc, assign_variable.cc).
# A converted SavedModel has them only when the converter could not freeze a variable into
# a constant; the interpreter then reads a variable nothing initialized.
VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")


def _refuse_unfrozen_weights(ops: dict[str, int]) -> None:
    found = [f"{ops[op]} {op}" for op in VARIABLE_OPS if ops.get(op)]
    if found:
        raise StageError(
            f"targets.litert: {MODEL_FILE} still reads variables ({', '.join(found)}): the converter did not "
            "freeze the weights into constants, so the interpreter would run on uninitialized variables"
        )


def _warnings(facts: dict[str, Any]) -> list[str]:
    """Kept composites that did not fuse, and state kept between calls."""
    warnings = []
    for c in facts["composites"]:
        if not c["kept"] or c["fused"]:
            continue
        if c["fused_op"] is None:
            warnings.append(f"targets.litert: composite {c['name']!r} is not one TensorFlow's converter fuses; "
                            "converted op by op")
        else:
            # The converter says why only in MLIR warnings its Python API drops; the usual
            # reason (CheckFusableKerasLstm) is an LSTM state of unknown batch size.
            hint = " (an LSTM fuses only with a fixed batch size)" if "LSTM" in c["fused_op"] else ""
            warnings.append(f"targets.litert: composite {c['name']!r} was kept but not fused into {c['fused_op']}; "
                            f"converted op by op{hint}")
    variables = facts["variable_tensors"]
    if variables:
        warnings.append(
            f"targets.litert: {MODEL_FILE} keeps {variables} variable tensor{'s' if variables != 1 else ''} "
            "(the state of fused recurrent ops) from one call to the next; a caller that wants the source's "
            "stateless calls resets them before each call (Interpreter.reset_all_variables())"
        )
    return warnings


def _signature_keys(model: Any, wanted: list[str] | None, init_key: str) -> list[str]:
    available = sorted(k for k in model.meta_graph.signature_def if k != init_key)
    if not available:
        raise StageError(f"{model.path}: the SavedModel has no signature; LiteRT converts signatures")
    if wanted is None:
        return available
    missing = [k for k in wanted if k not in available]
    if missing:
        raise StageError(f"targets.litert.signatures: the model has no signature {missing[0]!r}; "
                         f"its signatures: {', '.join(available)}")
    return sorted(wanted)


def _representative(model: Any, keys: list[str], options: dict[str, Any], context: StageContext) -> Any:
    """The calibration generator: (signature key, sample) over each signature's dataset,
    the form of TFLite's calibrator for multi-signature models (optimize/calibrator.py)."""
    from tpubuild.quantize import datasets
    from tpubuild.quantize.datasets import dataset_paths

    paths = dataset_paths(options, context)
    missing = [key for key in keys if key not in paths]
    if missing:
        raise StageError(
            f"targets.litert.quantization: int8 calibrates on a representative dataset and signature "
            f"{missing[0]!r} has none (converter.quantization_options.representative_datasets or "
            "verify.representative_datasets)"
        )
    samples = {}
    for key in keys:
        specs = datasets.signature_inputs(model, key)
        label = f"targets.litert: representative_datasets.{key}: {paths[key].name}"
        samples[key] = [datasets.check_sample(s, specs, f"{label}: sample {i}")
                        for i, s in enumerate(datasets.read_tfrecord(paths[key], label))]

    def generate() -> Any:
        for key in keys:
            for sample in samples[key]:
                yield key, sample

    return generate
