"""The XLA AOT runtime (the wheel's `tensorflow/xla_aot_runtime_src`) as a static library.

Compiling all of it takes long (each `convolution_lib_*.cc` instantiates Eigen's tensor
contractions: ~5 minutes and ~1.8 GB of memory each with g++ -O2 on one core; `sort_lib.cc`
~40 s), and a library needs few of those files. So:
  * the small core files are always compiled; an optional file (dot, convolution, sort) only
    when a generated header calls what it defines (`needed_sources` reads the headers);
  * each object is cached under `<workspace>/.tpubuild/xla_aot_runtime/`, keyed by the
    source's bytes, the compiler's identity, the flags and TensorFlow's version (its headers
    in `tensorflow/include` come with it), so a second verify run compiles nothing;
  * each stage run archives the objects it needs into a static library in its temp dir.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from tpubuild.errors import StageError

CACHE_DIR = Path(".tpubuild") / "xla_aot_runtime"
# The flags of the wheel's xla_aot_runtime_src/CMakeLists.txt, plus optimization and the
# C++ ABI TensorFlow was built with (saved_model_aot_compile.py's makefile: CXX11_ABI_FLAG).
WARNINGS = ["-Wno-ignored-attributes", "-Wno-deprecated-copy", "-Wno-cast-qual", "-Wno-sign-compare",
            "-Wno-interference-size"]
# Optional files by what a generated header calls; the C++ spelling of each type code.
_TYPES = {"f16": "Eigen::half", "f32": "float", "f64": "double", "c64": "std::complex<float>",
          "c128": "std::complex<double>", "s32": "int32_t", "s8": "int8_t"}


def tensorflow_dir() -> Path:
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise StageError("xla_aot: TensorFlow is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def runtime_sources() -> list[Path]:
    root = tensorflow_dir() / "xla_aot_runtime_src"
    sources = sorted(root.rglob("*.cc"))
    if not sources:
        raise StageError(f"xla_aot: no XLA AOT runtime sources in {root} (this TensorFlow wheel has none)")
    return sources


def _calls(source: Path) -> str | None:
    """The text a header contains when it needs `source`; None for a core file."""
    name = source.stem
    found = re.fullmatch(r"dot_lib_(\w+)", name)
    if found and found.group(1) in _TYPES:
        return f"TypedMatMul<{_TYPES[found.group(1)]}"
    found = re.fullmatch(r"convolution_lib_(\w+)_([23])d", name)
    if found and found.group(1) in _TYPES:
        return f"EigenConv{found.group(2)}D<{_TYPES[found.group(1)]}"
    if name == "sort_lib":
        return "SortInplace("
    if name.startswith(("dot_lib", "convolution_lib")):
        return name  # a type this table does not know: compiled when the link asks (see build_library)
    return None


def needed_sources(headers: list[str]) -> list[Path]:
    """Core files, and the optional files that the generated headers call."""
    text = "\n".join(headers)
    return [s for s in runtime_sources() if (called := _calls(s)) is None or called in text]


def runtime_names(headers: list[str]) -> list[str]:
    """needed_sources as paths relative to the TensorFlow package (what xla_aot.cmake lists)."""
    return [s.relative_to(tensorflow_dir()).as_posix() for s in needed_sources(headers)]


def optional_sources() -> list[Path]:
    return [s for s in runtime_sources() if _calls(s) is not None]


def compile_flags(abi_flag: int) -> list[str]:
    return ["-std=c++17", "-O2", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi_flag}",
            f"-I{tensorflow_dir() / 'include'}", *WARNINGS]


@cache
def compiler() -> tuple[str, str]:
    """(path, identity) of the system C++ compiler: $CXX, else c++ / g++ / clang++."""
    for candidate in filter(None, [os.environ.get("CXX"), "c++", "g++", "clang++"]):
        path = shutil.which(candidate)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
            return path, out.splitlines()[0] if out else candidate
    raise StageError("xla_aot: no C++ compiler found (set CXX, or install g++ or clang++)")


def object_for(source: Path, flags: list[str], cache: Path, tf_version: str) -> Path:
    """The cached object of one runtime source, compiled now if absent."""
    cxx, identity = compiler()
    digest = hashlib.sha256(
        "\0".join([identity, *flags, tf_version, source.relative_to(tensorflow_dir()).as_posix()]).encode()
        + source.read_bytes()
    ).hexdigest()
    target = cache / f"{source.stem}-{digest[:32]}.o"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    proc = subprocess.run([cxx, *flags, "-c", str(source), "-o", str(tmp)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
        raise StageError(f"xla_aot: compiling the XLA AOT runtime source {source.name} failed: {first}")
    os.replace(tmp, target)  # concurrent runs compile the same bytes; the last rename wins
    return target


def build_library(sources: list[Path], flags: list[str], workspace: Path, tf_version: str, out: Path) -> Path:
    """A static library of `sources` at `out` (objects from the workspace's cache)."""
    from concurrent.futures import ThreadPoolExecutor

    cache = Path(workspace) / CACHE_DIR
    # One compiler per core, at most 4: an Eigen-heavy file takes ~1.8 GB of memory.
    with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, 4))) as pool:
        objects = list(pool.map(lambda s: object_for(s, flags, cache, tf_version), sources))
    ar = shutil.which("ar")
    if ar is None:
        raise StageError("xla_aot: no 'ar' found to archive the XLA AOT runtime")
    out.unlink(missing_ok=True)
    subprocess.run([ar, "rcs", str(out), *map(str, objects)], check=True, capture_output=True)
    return out
