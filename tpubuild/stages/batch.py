"""Batch stage: BatchFunction around TPU calls, a named function's calls, or a signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import ConversionError
from tpubuild.stages import slices
from tpubuild.stages.base import GRAPH_ONLY, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "batch",
    options=lambda r: {
        "tags": slices.tags(r),
        "tpu_functions": slices.converter(r)["tpu_functions"],
        "batch_options": slices.converter(r)["batch_options"],
    },
    memory=GRAPH_ONLY,  # its peak memory (stages/base.py, measured there)
)

WHERE = "batch_options[0].experimental"


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """Insert BatchFunction ops as `batch_options[0]` asks; checks run before anything is written."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.transforms import batch_checks, batching

    if not options["batch_options"]:
        raise ConversionError("batch stage: batch_options is empty; nothing to batch")
    entry = options["batch_options"][0]
    model = SavedModel.load(Path(input_dir), options["tags"])
    experimental = entry.get("experimental", {})
    if "signature_name" in experimental:
        key = experimental["signature_name"]
        fn = _signature_function(model, key)
        what = f'batched signature "{key}"'
        findings = batch_checks.check_specs(what, *batch_checks.signature_specs(model, key))
        _raise(findings)
        sites = [batching.split_signature(model, fn)]
        mode, target = "signature", key
    else:
        if experimental:
            fn = _named_function(model, experimental)
            sites = [batching.BatchSite(c, n, fn) for c, n in model.call_sites(fn) if _calls(n, fn)]
            if not sites:
                raise ConversionError(
                    f"{WHERE}: function {model.describe(fn)} is not called from any function of "
                    "the model, so there is no call to batch"
                )
            mode, target = "function", model.alias_of(fn) or fn
        else:
            sites = _tpu_sites(model, options["tpu_functions"])
            mode, target = "tpu_call_sites", None
        findings = batch_checks.Findings()
        for callee in sorted({s.callee for s in sites}):
            site = next(s for s in sites if s.callee == callee)
            if not site.batched:
                findings.errors.append(
                    f"batched function {model.describe(callee)}: every input is a resource or "
                    "variant; BatchFunction needs at least one tensor to batch along dimension 0"
                )
                continue
            specs = batch_checks.function_specs(model, callee, site.batched)
            found = batch_checks.check_specs(f"batched function {model.describe(callee)}", *specs)
            findings.errors += found.errors
            findings.warnings += found.warnings
        _raise(findings)
    digest = batching.model_digest(model)  # before any edit: the input decides the queue names
    done = [batching.batch_site(model, site, entry, digest) for site in sites]
    warnings = findings.warnings + batch_checks.recompilation_warnings(model)
    # The TPU runtime's rules hold after every rewrite of a TPU body, not only after placement.
    from tpubuild.tpu.runtime_check import enforce

    rule_warnings = enforce(model)
    model.save(Path(output_dir))
    summary = {
        "mode": mode,
        "target": target,
        "options": batching.batch_attrs(entry),
        "sites": [d.summary() for d in done],
    }
    for d in done:
        context.log(f"batch: {d.caller}/{d.node} -> BatchFunction({d.callee})")
    return StageResult(summary=summary, warnings=warnings + rule_warnings)


def _raise(findings: Any) -> None:
    if findings.errors:
        raise ConversionError("; ".join(findings.errors))


def _calls(node: Any, fn: str) -> bool:
    from tpubuild.savedmodel.fnedit import ANY_CALL_OPS

    return node.op in ANY_CALL_OPS and node.attr["f"].func.name == fn


def _signature_function(model: Any, key: str) -> str:
    signatures = model.signatures
    if key not in signatures:
        listed = ", ".join(f'"{k}"' for k in sorted(signatures)) or "none"
        raise ConversionError(f'{WHERE}: unknown signature "{key}"; signatures: {listed}')
    return signatures[key]


def _named_function(model: Any, experimental: dict[str, str]) -> str:
    """Resolve an experimental function_alias / concrete_function_name like a tpu_functions entry."""
    from tpubuild.tpu.functions import resolve_tpu_functions

    try:
        (found,) = resolve_tpu_functions(model, [dict(experimental)])
    except ConversionError as exc:
        raise ConversionError(str(exc).replace("tpu_functions[0]", WHERE, 1)) from None
    return found.name


def _tpu_sites(model: Any, tpu_functions: list[dict[str, Any]]) -> list[Any]:
    """Every TPUPartitionedCall outside TPU code; else calls of the recipe's TPU functions.

    The graph is the source of truth: the tpu stage has already turned each TPU function's
    call sites into TPUPartitionedCall, and TPU computations that were in the model before
    conversion are batched too, as the converter does. A model that skipped placement falls
    back to the functions the recipe names.
    """
    from tpubuild.transforms.batching import TPU_CALL, BatchSite

    tpu_bodies = {
        n.attr["f"].func.name
        for fdef in model.functions.values()
        for n in fdef.node_def
        if n.op == TPU_CALL
    }
    tpu_code = set(tpu_bodies).union(*(model.reachable(b) for b in tpu_bodies))
    sites = [
        BatchSite(name, node, node.attr["f"].func.name)
        for name, fdef in sorted(model.functions.items())
        if name not in tpu_code
        for node in fdef.node_def
        if node.op == TPU_CALL
    ]
    if sites or not tpu_functions:
        if not sites:
            raise ConversionError(
                "batch_options[0]: the model has no TPU function call to batch; name a target "
                f"with {WHERE} (function_alias, concrete_function_name or signature_name)"
            )
        return sites
    from tpubuild.tpu.functions import resolve_tpu_functions

    names = {f.name for f in resolve_tpu_functions(model, tpu_functions)}
    return [
        BatchSite(c, n, fn) for fn in sorted(names) for c, n in model.call_sites(fn) if _calls(n, fn)
    ]
