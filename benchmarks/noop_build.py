"""No-op `tpubuild build` of 200 and 2,000 realistic recipes, beside `dvc repro` and
`dvc status` on an equivalent pipeline of the same models, measured in the same run.

Recipes: TPU placement (a function alias) and batching on distinct models (each model
has its own weights, so each recipe has its own stage keys). 2,000 recipes are ten
recipes per model (different names: their stages are shared cache entries, each is
published and checked on its own). Both workspaces share one cache_dir.
Targets: 200 recipes < 0.25 s and >= 10x faster than `dvc repro`; 2,000 < 1.5 s.
`build --check` on the 200 recipes, in the built workspace and in a fresh clone of it (the
recipes, models and lock files; no cache, no `.tpubuild/`, as CI has it): >= 10x faster
than `dvc status` and within 2x of the no-op build, each ratio from the same run.
dvc comes from `pip install -e '.[bench]'` or a `dvc` on PATH (DVC env var: its path).
Prints the figures; asserts nothing.
Usage: python3 benchmarks/noop_build.py [MODELS] [RECIPES_PER_MODEL]  (1: the MODELS recipes only)
       NOOP_BENCH_KEEP=DIR keeps the workspaces in DIR (and reuses what is built there: profiling).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import best_of, best_of_cpu, probe_in_process

EXPORT = """
import sys, tensorflow as tf
class M(tf.Module):
    def __init__(self, scale):
        super().__init__()
        self.w = tf.Variable([[1.0], [scale]])
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def tpu_func(self, x):
        return tf.matmul(x, self.w)
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 1.0}
for i, out in enumerate(sys.argv[1:]):
    m = M(float(i + 2))
    tf.saved_model.save(m, out, signatures={"serving_default": m.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": m.tpu_func}))
"""

RECIPE = """\
name: r{m:03d}_{k}
model: {{saved_model: ../models/m{m:03d}}}
converter:
  tpu_functions: [{{function_alias: tpu_func}}]
  batch_options:
    - {{num_batch_threads: 1, max_batch_size: 8, batch_timeout_micros: {timeout}, allowed_batch_sizes: [2, 4, 8],
       max_enqueued_batches: 10, experimental: {{signature_name: serving_default}}}}
verify: {{samples: 2}}
"""

# The dvc pipeline does the same bookkeeping for the same models: one stage per recipe
# with the model directory as a dependency and a copy of it as the output.
DVC_STAGE = """  r{m:03d}_{k}:
    cmd: cp -r models/m{m:03d} built/r{m:03d}_{k}
    deps: [models/m{m:03d}]
    outs: [built/r{m:03d}_{k}]
"""


def workspace(root: Path, models: int, per_model: int) -> None:
    (root / "recipes").mkdir(parents=True)
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\ncache_dir: ../cache\n")
    for m in range(models):
        for k in range(per_model):
            (root / "recipes" / f"r{m:03d}_{k}.yaml").write_text(RECIPE.format(m=m, k=k, timeout=1000))


def dvc_pipeline(root: Path, dvc: str, models: int, per_model: int) -> None:
    shutil.copytree(root.parent / "models", root / "models")
    (root / "built").mkdir()
    stages = "".join(DVC_STAGE.format(m=m, k=k) for m in range(models) for k in range(per_model))
    (root / "dvc.yaml").write_text("stages:\n" + stages)
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=root, check=True)
    subprocess.run([dvc, "repro", "-q"], cwd=root, check=True, capture_output=True)


def fresh_clone(root: Path, clone: Path) -> None:
    """What a fresh clone of the built workspace has: recipes, lock files, models and the
    same workspace file, one directory deeper so that its `cache_dir: ../cache` names an
    empty cache (its own)."""
    clone.mkdir(parents=True)
    for part in ("recipes", "models"):
        shutil.copytree(root / part, clone / part)
    shutil.copy(root / "tpubuild.yaml", clone / "tpubuild.yaml")


def check_time(runs: int, root: Path, fresh: bool, memo: bool = True) -> tuple[float, float]:
    """(wall, CPU) of `build --check`, best of `runs` (it must answer "up to date");
    `fresh`: each run without `.tpubuild/` (no cache, stat cache or memo), as in CI's
    clone; without `memo`, each run without the no-op memo (a check after any change)."""

    def before() -> None:
        if fresh:
            shutil.rmtree(root / ".tpubuild", ignore_errors=True)
            shutil.rmtree(root.parent / "cache", ignore_errors=True)
        if not memo:
            (root / ".tpubuild" / "noop-memo.json").unlink(missing_ok=True)

    def up_to_date(out: subprocess.CompletedProcess) -> None:
        assert out.returncode == 0 and out.stdout.endswith("up to date\n"), out.stdout[-500:] + out.stderr[-2000:]

    return best_of_cpu(runs, [sys.executable, "-m", "tpubuild", "build", "--check"], root, before, up_to_date)


def compile_tpubuild() -> None:
    """tpubuild's bytecode, as pip writes it when it installs a package: an editable
    checkout's is written by its first import, unless PYTHONDONTWRITEBYTECODE (set on some
    machines, this one included) prevents it, and then every run compiles tpubuild's
    modules again (10 ms). dvc, installed by pip, always has its bytecode."""
    import compileall

    import tpubuild

    compileall.compile_dir(str(Path(tpubuild.__file__).parent), quiet=1)


def find_dvc() -> str | None:
    return os.environ.get("DVC") or shutil.which("dvc")


def main(models: int = 200, per_model: int = 10, runs: int = 5) -> None:
    keep = os.environ.get("NOOP_BENCH_KEEP")
    compile_tpubuild()
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()) as tmp:
        base = Path(tmp)
        start = time.perf_counter()
        paths = [str(base / "models" / f"m{m:03d}") for m in range(models)]
        if not all(Path(p).is_dir() for p in paths):
            subprocess.run([sys.executable, "-c", EXPORT, *paths], check=True, capture_output=True)
        print(f"{models} distinct models exported in {time.perf_counter() - start:.1f} s")
        figures = {}
        sizes = ((models, 1), (models * per_model, per_model)) if per_model > 1 else ((models, 1),)
        for count, per in sizes:
            root = base / f"ws{count}"
            if not (root / "recipes").is_dir():
                root.mkdir()
                shutil.copytree(base / "models", root / "models")
                workspace(root, models, per)
            start = time.perf_counter()
            first = subprocess.run([sys.executable, "-m", "tpubuild", "build", "-j", "2", "--relock"], cwd=root,
                                   capture_output=True, text=True)
            assert first.returncode == 0, first.stderr[-2000:]
            print(f"first build of {count} recipes: {time.perf_counter() - start:.1f} s "
                  f"({first.stdout.strip().splitlines()[-1]})")
            figures[count], cpu = best_of_cpu(runs, [sys.executable, "-m", "tpubuild", "build"], root)
            print(f"no-op `tpubuild build`, {count} recipes: {figures[count]:.3f} s, CPU {cpu:.3f} s (best of {runs}; "
                  f"target < {0.25 if count <= 200 else 1.5} s)")
            if count == models:
                noop_cpu = cpu
            probe_in_process(["build"], root)
            # The full check behind the memo: what the first no-op after any change costs.
            full = float("inf")
            for _ in range(min(runs, 3)):
                (root / ".tpubuild" / "noop-memo.json").unlink(missing_ok=True)
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "tpubuild", "build"], cwd=root, check=True, capture_output=True)
                full = min(full, time.perf_counter() - start)
            print(f"  without the no-op memo (every recipe loaded, every record read): {full:.3f} s")
            if count == models:
                checks = {"built": check_time(runs, root, fresh=False),
                          "built, without the no-op memo": check_time(runs, root, fresh=False, memo=False)}
                shutil.rmtree(base / "fresh", ignore_errors=True)
                fresh_clone(root, base / "fresh" / "ws")
                checks["fresh clone"] = check_time(runs, base / "fresh" / "ws", fresh=True)
                for where, (seconds, cpu) in checks.items():
                    print(f"`build --check`, {count} recipes, {where}: {seconds:.3f} s, CPU {cpu:.3f} s (best of "
                          f"{runs}): {seconds / figures[count]:.2f}x the no-op build's wall time, "
                          f"{cpu / noop_cpu:.2f}x its CPU time (target <= 2x)")
        python = best_of(runs, [sys.executable, "-c", "pass"], base)
        print(f"  reference, same run: `python -c pass` {python:.3f} s")
        dvc = find_dvc()
        if dvc is None:
            print("  dvc: not installed (pip install -e '.[bench]'), no reference")
            return
        shutil.rmtree(base / "dvc", ignore_errors=True)
        dvc_root = base / "dvc" / "ws"
        dvc_root.mkdir(parents=True)
        shutil.copytree(base / "models", dvc_root.parent / "models")
        dvc_pipeline(dvc_root, dvc, models, 1)
        repro = best_of(runs, [dvc, "repro", "-q"], dvc_root)
        status, status_cpu = best_of_cpu(runs, [dvc, "status", "-q"], dvc_root)
        print(f"  reference, same run, {models} stages: `dvc repro` {repro:.3f} s, `dvc status` {status:.3f} s; "
              f"tpubuild is {repro / figures[models]:.1f}x faster than `dvc repro` (target >= 10x)")
        print(f"  `dvc status` CPU {status_cpu:.3f} s")
        for where, (seconds, cpu) in checks.items():
            print(f"  `build --check`, {where}: {status / seconds:.1f}x faster than `dvc status` in wall time, "
                  f"{status_cpu / cpu:.1f}x in CPU time (target >= 10x)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
