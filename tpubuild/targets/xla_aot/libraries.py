"""XLA AOT libraries of a SavedModel's signatures: names, the compiler's process, the facts.

The compiling itself is in compile.py (its own process); this module plans the
jobs, runs that process, and describes what it wrote (xla_aot.json, xla_aot.cmake).
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError

NAMESPACE = "tpubuild_xla_aot"
FACTS_JSON = "xla_aot.json"
CMAKE_SNIPPET = "xla_aot.cmake"
RUNTIME_LIBRARY = "tpubuild_xla_aot_runtime"
# C++ keywords a signature key could spell; the class name gets a suffix then.
_CPP_KEYWORDS = {"and", "auto", "bool", "break", "case", "char", "class", "const", "default", "delete", "do",
                 "double", "else", "enum", "float", "for", "if", "int", "long", "namespace", "new", "or",
                 "private", "public", "return", "short", "signed", "static", "struct", "switch", "this",
                 "true", "false", "union", "using", "void", "while"}
ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h


@dataclass(frozen=True)
class Job:
    signature: str
    batch: int

    @property
    def prefix(self) -> str:
        """File prefix and C++ class name: the signature key as an identifier, then the batch."""
        ident = re.sub(r"[^0-9A-Za-z_]", "_", self.signature)
        if not ident or ident[0].isdigit() or ident in _CPP_KEYWORDS:
            ident = "s_" + ident
        return f"{ident}_b{self.batch}"

    @property
    def cpp_class(self) -> str:
        return f"{NAMESPACE}::{self.prefix}"

    @property
    def library(self) -> str:
        """The CMake target name of this (signature, batch)."""
        return f"{NAMESPACE}_{self.prefix}"

    def as_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "batch": self.batch, "prefix": self.prefix, "cpp_class": self.cpp_class}


def plan_jobs(signatures: list[str], batch_sizes: list[int]) -> list[Job]:
    jobs = [Job(s, b) for s in signatures for b in sorted(set(batch_sizes))]
    seen: dict[str, Job] = {}
    for job in jobs:
        other = seen.setdefault(job.prefix, job)
        if other is not job:
            raise StageError(
                f"xla_aot: signatures {other.signature!r} and {job.signature!r} give the same C++ name "
                f"{job.prefix!r}; compile only one of them"
            )
    return jobs


def run_compiler(source: Path, tags: list[str], jobs: list[Job], out_dir: Path, log: Any) -> dict[str, Any]:
    """Run compile.py in a child process; its results by job prefix. The child's own
    output (TensorFlow's log lines included) goes to the stage's log, never to the terminal.

    The child sees the same inputs on every build: it runs in a scratch directory with
    relative paths only (`source` is a symlink), without ASLR and with a fixed hash seed,
    because the order of the generated code follows hash tables keyed by heap addresses,
    which shift with any difference in what the process allocates (a longer path name: its
    working directory is a fresh temp dir whose name always has the same length)."""
    with tempfile.TemporaryDirectory(prefix="tpubuild-xla-aot-") as tmp:
        work = Path(tmp)
        (work / "source").symlink_to(Path(source).resolve(), target_is_directory=True)
        (work / "out").mkdir()
        (work / "jobs.json").write_text(json.dumps({
            "source": "source", "tags": tags, "out_dir": "out", "scratch": "scratch",
            "jobs": [j.as_dict() for j in jobs],
        }))
        env = compiler_env()
        proc = subprocess.run(
            [sys.executable, "-m", "tpubuild.targets.xla_aot.compile", "jobs.json", "results.json"],
            cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            preexec_fn=_no_address_randomization, check=False,
        )
        output = proc.stdout.decode(errors="replace")
        for line in output.splitlines():
            log(f"xla_aot compiler: {line}")
        if proc.returncode != 0 or not (work / "results.json").exists():
            raise StageError(f"xla_aot: the XLA AOT compiler stopped (exit {proc.returncode}): {_last_error(output)}")
        for produced in sorted((work / "out").iterdir()):
            shutil.move(str(produced), str(Path(out_dir) / produced.name))  # /tmp may be another file system
        return json.loads((work / "results.json").read_text())


def compiler_env() -> dict[str, str]:
    """The child's environment: what it needs to run and what changes TensorFlow's and XLA's
    output (the engine's allow-list), nothing else. Every variable takes memory in the
    child, so an unrelated one (a test runner's PYTEST_CURRENT_TEST) would shift its heap
    and with it the generated code's order (see run_compiler)."""
    from tpubuild.digests import ENV_THREADS, worker_env

    # A worker's own environment (digests/toolchain_facts.py), less what sizes thread pools
    # or tells tpubuild's logging: neither reaches the generated code, both shift the heap.
    env = {name: value for name, value in worker_env().items()
           if name not in (*ENV_THREADS, "TPUBUILD_DEBUG", "TPUBUILD_QUIET_TENSORFLOW")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _no_address_randomization() -> None:
    """The generated code's order depends on hash tables seeded by addresses (absl's hash
    seed is the address of a global): without ASLR the same input gives the same bytes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = libc.personality(0xFFFFFFFF)
        libc.personality(current | ADDR_NO_RANDOMIZE)
    except (OSError, AttributeError):
        pass  # not Linux: the outputs may then differ between builds


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Check failed" in line or "rror" in line:
            return line
    return lines[-1] if lines else "no output"


_LOGICAL_SIGNATURE = re.compile(r"// The logical function signature is:\n//\s+\((.*)\) -> \((.*)\)\n")
_SHAPE = re.compile(r"(\w+)\[([0-9,]*)\]")


def header_shapes(header: str) -> tuple[list[list[int]], list[list[int]]]:
    """(arg shapes, result shapes) from the comment tfcompile writes above the class."""
    found = _LOGICAL_SIGNATURE.search(header)
    if not found:
        raise StageError("xla_aot: the generated header has no 'logical function signature' comment")

    def shapes(text: str) -> list[list[int]]:
        return [[int(d) for d in m.group(2).split(",") if d] for m in _SHAPE.finditer(text)]

    return shapes(found.group(1)), shapes(found.group(2))


def cmake_snippet(libraries: list[dict[str, Any]], runtime_sources: list[str]) -> str:
    """One CMake file for the whole target: the runtime files these libraries call, from the
    wheel's xla_aot_runtime_src, built as a static library, and one static library per
    (signature, batch) that links it. The TensorFlow wheel is found at configure time (its
    headers and runtime sources). Abseil, which the generated headers use, comes from
    TPUBUILD_XLA_AOT_ABSL when set (your own build of the same Abseil release), else from
    the wheel's libtensorflow_framework.so.2 (xla_aot_harness.absl_link_flags says why)."""
    lines = [
        "# Generated by tpubuild (xla_aot). include() it from a CMakeLists.txt (C++17).",
        "# Needs TensorFlow's Python wheel (headers + xla_aot_runtime_src): set TENSORFLOW_DIR",
        "# to its package directory, or let Python find it.",
        "if(NOT TENSORFLOW_DIR)",
        "  find_package(Python3 REQUIRED COMPONENTS Interpreter)",
        "  execute_process(",
        "    COMMAND ${Python3_EXECUTABLE} -c",
        "      \"import importlib.util; print(importlib.util.find_spec('tensorflow').submodule_search_locations[0])\"",
        "    OUTPUT_VARIABLE TENSORFLOW_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)",
        "endif()",
        "if(NOT TPUBUILD_XLA_AOT_ABSL)",
        '  set(TPUBUILD_XLA_AOT_ABSL "${TENSORFLOW_DIR}/libtensorflow_framework.so.2")',
        "endif()",
        f"if(NOT TARGET {RUNTIME_LIBRARY})",
        f"  add_library({RUNTIME_LIBRARY} STATIC",
        *(f'    "${{TENSORFLOW_DIR}}/{name}"' for name in runtime_sources),
        "  )",
        f"  target_include_directories({RUNTIME_LIBRARY} PUBLIC \"${{TENSORFLOW_DIR}}/include\")",
        f"  target_link_libraries({RUNTIME_LIBRARY} PUBLIC ${{TPUBUILD_XLA_AOT_ABSL}})",
        f"  target_compile_features({RUNTIME_LIBRARY} PUBLIC cxx_std_17)",
        # the flags of the wheel's own xla_aot_runtime_src/CMakeLists.txt
        (f"  target_compile_options({RUNTIME_LIBRARY} PRIVATE -Wno-ignored-attributes -Wno-deprecated-copy "
         "-Wno-cast-qual -Wno-sign-compare)"),
        f"  set_target_properties({RUNTIME_LIBRARY} PROPERTIES POSITION_INDEPENDENT_CODE ON)",
        "endif()",
    ]
    for lib in libraries:
        objects = " ".join(f'"${{CMAKE_CURRENT_LIST_DIR}}/{name}"' for name in lib["objects"])
        target = lib["cmake_target"]
        lines += [
            f"# signature {lib['signature']!r}, batch {lib['batch']}: class {lib['cpp_class']} in {lib['header']}",
            f"add_library({target} STATIC {objects})",
            f"set_target_properties({target} PROPERTIES LINKER_LANGUAGE CXX)",
            f'target_include_directories({target} PUBLIC "${{CMAKE_CURRENT_LIST_DIR}}")',
            f"target_link_libraries({target} PUBLIC {RUNTIME_LIBRARY})",
        ]
    return "\n".join(lines) + "\n"
