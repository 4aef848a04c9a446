"""The check every stage that changes TPU functions ends with: the TPU runtime's rules,
then (when they found no error) TensorFlow's MLIR bridge as a second opinion."""

from __future__ import annotations

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.findings import ERROR, WARNING, Finding
from tpubuild.tpu.mlir_bridge import bridge_findings
from tpubuild.tpu.runtime_rules import check_tpu_runtime_rules


def all_findings(model: SavedModel, bridge: bool = True) -> list[Finding]:
    """The rules' findings, then (when they found no error) the MLIR bridge's second opinion."""
    findings = check_tpu_runtime_rules(model)
    if bridge and not any(f.severity == ERROR for f in findings):
        findings += bridge_findings(model)
    return findings


def enforce(model: SavedModel, bridge: bool = True) -> list[str]:
    """The tpu stage's post-condition: raise ConversionError naming every error; return warnings."""
    from tpubuild.errors import ConversionError

    findings = all_findings(model, bridge)
    errors = [str(f) for f in findings if f.severity == ERROR]
    if len(errors) == 1:
        raise ConversionError(errors[0])
    if errors:
        raise ConversionError(f"{len(errors)} TPU runtime rule violations: " + "; ".join(errors))
    return [str(f) for f in findings if f.severity == WARNING]
