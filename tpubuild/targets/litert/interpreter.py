"""Run a LiteRT flatbuffer with the LiteRT interpreter (ai_edge_litert), one signature at a time.

A kernel the interpreter lacks shows up when a signature's tensors are allocated: the
interpreter's RuntimeError ends "Node number N (OP) failed to prepare." (custom ops: the
"Encountered unresolved custom op" of tensorflow/lite/core/subgraph.cc; select-TF ops:
"Select TensorFlow op(s) ... not supported by this interpreter", because the ai-edge-litert
wheel does not link the Flex delegate). That op is named in one line; it is never skipped.

A flatbuffer with variable tensors is stateful: a fused LSTM starts from the state the
previous call left (measured: the second call of the example model differs from the source
by 1e-2), where its source started every call from zeros. Such a model is run as a
stateless caller must run it: `reset_all_variables()` before each call. The interpreter
resets only when every subgraph holding variables has its tensors allocated
(ResetVariableTensors in tensorflow/lite/core/subgraph.cc checks `tensor.data.raw`), and a
signature runner allocates its subgraph on its first call, so each signature is called
once on zeros first.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from tpubuild.errors import StageError
from tpubuild.targets.litert.convert import captured_output
from tpubuild.targets.litert.flatbuffer import FLEX_PREFIX, require_litert

Sample = dict[str, np.ndarray]


class LiteRTModel:
    """The interpreter of one flatbuffer and a runner per signature."""

    def __init__(self, path: Path, stateful: bool):
        require_litert()
        from ai_edge_litert.interpreter import Interpreter

        self.path = path
        self.stateful = stateful
        with captured_output():  # "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
            try:
                self.interpreter = Interpreter(model_path=str(path))
            except (RuntimeError, ValueError) as exc:
                raise StageError(describe_interpreter_error(exc, path)) from None
        self._runners: dict[str, Any] = {}
        self._allocated = False
        if stateful:
            for key in sorted(self.interpreter.get_signature_list()):
                runner = self.runner(key)
                zeros = {name: np.zeros(d["shape"], d["dtype"]) for name, d in runner.get_input_details().items()}
                self.call(key, zeros)
        self._allocated = True

    def runner(self, key: str) -> Any:
        if key not in self._runners:
            try:
                self._runners[key] = self.interpreter.get_signature_runner(key)
            except ValueError:
                listed = ", ".join(sorted(self.interpreter.get_signature_list())) or "none"
                raise StageError(f"{self.path.name}: no signature {key!r}; its signatures: {listed}") from None
        return self._runners[key]

    def invoke(self, key: str, sample: Sample) -> dict[str, Any]:
        """One stateless call: the variables reset first when there are any."""
        if self.stateful and self._allocated:
            self.interpreter.reset_all_variables()
        return self.runner(key)(**sample)

    def call(self, key: str, sample: Sample) -> dict[str, np.ndarray]:
        with captured_output():
            try:
                return {name: np.array(value) for name, value in self.invoke(key, sample).items()}
            except (RuntimeError, ValueError) as exc:
                raise StageError(f"signature {key!r}: {describe_interpreter_error(exc, self.path)}") from None

    def run_signature(self, key: str, samples: list[Sample]) -> dict[str, np.ndarray]:
        """Every sample through signature `key`; outputs stacked on a new first axis, as
        compare.run_signature stacks the source's."""
        outputs: dict[str, list[np.ndarray]] = {}
        for sample in samples:
            for name, value in self.call(key, sample).items():
                outputs.setdefault(name, []).append(value)
        return {name: np.stack(values) for name, values in outputs.items()}


def describe_interpreter_error(exc: Exception, path: Path) -> str:
    """One line naming the op the interpreter has no kernel for, else its first line."""
    message = str(exc)
    match = re.search(r"Node number (\d+) \(([^)]+)\) failed to prepare", message)
    if match:
        node, op = match.groups()
        if op.startswith(FLEX_PREFIX):
            return (f"LiteRT interpreter: op {op} (node {node}, TensorFlow op {op[len(FLEX_PREFIX):]} kept by "
                    "select_tf_ops) needs the Flex delegate, which the ai-edge-litert interpreter does not include; "
                    f"{path.name} cannot be verified here")
        if "unresolved custom op" in message:
            return (f"LiteRT interpreter: custom op {op} (node {node}) has no kernel in this interpreter; "
                    "register one with the interpreter (a fused tfl_fusable_op composite needs its own kernel)")
        first = message.strip().splitlines()[0]
        return f"LiteRT interpreter: op {op} (node {node}) failed to prepare: {first}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"LiteRT interpreter: {lines[0] if lines else type(exc).__name__}"
