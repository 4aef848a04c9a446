"""Check that the xla_aot target's CMake snippet works: a consumer project include()s it,
links one (signature, batch) library, configures and builds with cmake, and runs.

Too slow for the test suite (cmake compiles the XLA AOT runtime files from scratch:
~30 s on 2 cores), so it is a script. Usage:
  python scripts/xla_aot_cmake_check.py [MODEL_SCRIPT]   (default recipes/models/all_targets.py)
Prints the consumer's output (its first result values) and exits non-zero on any failure.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpubuild.quiet import quiet_tensorflow

CONSUMER_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(xla_aot_consumer CXX)
set(CMAKE_CXX_STANDARD 17)
include("{artifact}/xla_aot.cmake")
add_executable(consumer main.cc)
target_link_libraries(consumer PRIVATE {target})
"""

CONSUMER_MAIN = """#include <cstdio>
#include <cstring>
#include "{header}"
int main() {{
  {cpp_class} fn;
  for (int i = 0; i < fn.num_args(); ++i) std::memset(fn.arg_data(i), 0, fn.arg_size(i));
  if (!fn.Run()) {{ std::printf("Run failed: %s\\n", fn.error_msg().c_str()); return 1; }}
  const float* out = static_cast<const float*>(fn.result_data(0));
  std::printf("%s result 0 (%d bytes):", "{cpp_class}", fn.result_size(0));
  for (int i = 0; i < fn.result_size(0) / 4 && i < 8; ++i) std::printf(" %g", out[i]);
  std::printf("\\n");
  return 0;
}}
"""


def main(argv: list[str]) -> int:
    quiet_tensorflow()
    from tpubuild.stages.base import StageContext
    from tpubuild.targets.xla_aot import stage as xla_aot

    script = Path(argv[0] if argv else "recipes/models/all_targets.py")
    spec = importlib.util.spec_from_file_location("example_model", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source, artifact, project = root / "source", root / "xla_aot", root / "consumer"
        module.export(str(source))
        artifact.mkdir(), project.mkdir()
        options = {"tags": ["serve"], "signatures": ["serving_default"], "batch_sizes": [1]}
        xla_aot.run(source, artifact, options, StageContext(root, inputs={"source": source}))
        lib = json.loads((artifact / "xla_aot.json").read_text())["libraries"][0]
        (project / "CMakeLists.txt").write_text(CONSUMER_CMAKE.format(artifact=artifact, target=lib["cmake_target"]))
        (project / "main.cc").write_text(CONSUMER_MAIN.format(header=lib["header"], cpp_class=lib["cpp_class"]))
        start = time.perf_counter()
        for command in (["cmake", "-S", str(project), "-B", str(project / "build"), f"-DPython3_EXECUTABLE={sys.executable}"],
                        ["cmake", "--build", str(project / "build"), "-j", "2"]):
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            print(f"$ {' '.join(command[:2])} ...: exit {proc.returncode}")
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                return 1
        print(f"configure + build: {time.perf_counter() - start:.1f} s")
        run = subprocess.run([str(project / "build" / "consumer")], capture_output=True, text=True, check=False)
        print(run.stdout.strip() or run.stderr.strip())
        return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
