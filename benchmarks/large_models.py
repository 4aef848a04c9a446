"""Large models through tpubuild: a cold build beside a plain load + save of the same model.

For each size (GiB of float32 weights, `--sizes 2,8`; default 2 and 8) a dense stack of
32 square float32 matrices with tanh between (2 GiB: 32 x 4096 x 4096, 8 GiB: 32 x 8192 x
8192), random weights, is exported once the converter guide's way (a serving signature
calling `tpu_func`, the whole stack, saved under that alias); then, in the same run:

- the floor: a fresh process doing `tf.saved_model.load` + `tf.saved_model.save` of it;
- the durable floor: the same, then every file it wrote fsynced (TensorFlow's save never
  fsyncs, tpubuild's every write does): printed beside, the goals measured against the floor;
- the cold `tpubuild build --json` of a recipe with TPU placement, bfloat16, batching,
  verify on 8 samples and publish (nothing of an earlier run in the cache or out/).

Each prints its wall time (and CPU time, user + system of it and all it waited for,
which other work on a shared machine disturbs less), the machine's peak used memory (MemTotal - MemAvailable of
/proc/meminfo sampled every 0.25 s, above what was used just before it started), each of
its processes' max RSS (VmHWM/VmRSS sampled, and the workers' own per-stage peak from the
rows), and the bytes read and written: per stage from the build's own accounting (the
`io` of `build --json` rows: the worker's /proc/self/io over the stage plus the engine's
own reading and storing for it) when the build has it, else per process from
/proc/<pid>/io sampled. `rchar`/`wchar` count every read()/write() (page cache or not;
memory-mapped reads are not in them), `read_bytes`/`write_bytes` what reached the disk.
Beside the used memory, the peak of the command's processes' VmRSS summed in one sample:
other work on the machine moves MemAvailable (its page cache, its processes ending), never
this. Then the ratios against the goals of issue 54: time <= 1.5x, memory <= 1.15x.
Asserts nothing.

The machine the figures come from matters: on a shared machine wall time measures the
queue for a core as much as the work, and other processes' memory moves the sampled
baseline; say so when quoting them.

`--saved-model DIR` measures a SavedModel of someone else's the same way (it needs a
`tpu_func` alias; e.g. keras_hub's GPT2Backbone exported the converter guide's way), with
`--rtol` where bfloat16 over many layers needs a wider tolerance than verify's default.

Run: python benchmarks/large_models.py [--sizes 2,8] [--keep DIR] [--saved-model DIR [--rtol R]]
     [--python /path/to/python] [--pythonpath /work/wt/base]   (a before/after of a checkout)
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

LAYERS = 32
GOAL_TIME = 1.5
GOAL_MEMORY = 1.15
SAMPLE_SECONDS = 0.25

EXPORT = textwrap.dedent('''\
    """Export for benchmarks/large_models.py: LAYERS x N x N float32, tanh between (random weights)."""
    import sys

    import numpy as np
    import tensorflow as tf

    def export(out, n, layers):
        rng = np.random.default_rng(0)

        class Stack(tf.Module):
            def __init__(self):
                super().__init__()
                # One layer's values at a time in numpy (the variables hold the model once).
                self.weights = [tf.Variable(rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n)),
                                            name=f"w{i}") for i in range(layers)]

            @tf.function(input_signature=[tf.TensorSpec([None, n], tf.float32)])
            def tpu_func(self, x):
                for w in self.weights:
                    x = tf.tanh(tf.matmul(x, w))
                return x

            @tf.function(input_signature=[tf.TensorSpec([None, n], tf.float32, name="x")])
            def serve(self, x):
                return {"y": self.tpu_func(x)}

        m = Stack()
        tf.saved_model.save(m, out, signatures={"serving_default": m.serve},
                            options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": m.tpu_func}))

    if __name__ == "__main__":
        export(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
''')

RECIPE = """\
name: {name}
model: {{saved_model: ../sources/{name}}}
converter:
  tpu_functions: [{{function_alias: tpu_func}}]
  bfloat16_optimization: ENABLED
  bfloat16_optimization_options: {{scope: TPU}}
  batch_options:
    - num_batch_threads: 2
      max_batch_size: 8
      batch_timeout_micros: 5000
      allowed_batch_sizes: [4, 8]
      max_enqueued_batches: 10
      disable_large_batch_splitting: true
      experimental: {{function_alias: tpu_func}}
verify: {{samples: 8{rtol}}}
"""

FLOOR = "import sys, tensorflow as tf\ntf.saved_model.save(tf.saved_model.load(sys.argv[1]), sys.argv[2])"
# The same, then every file it wrote and their directories fsynced: TensorFlow's save never
# fsyncs (strace of FLOOR: renames, no fsync or fdatasync; tensorflow/core/util/tensor_bundle
# BundleWriter::Finish closes and renames), so FLOOR's written bytes may still be in the page
# cache when it exits, where tpubuild's are on the disk (every write fsynced, atomic.py):
# the durable floor pays the same for its writes as the build does.
FLOOR_DURABLE = FLOOR + """
import os
for top, dirs, files in os.walk(sys.argv[2]):
    for name in files + ["."]:
        fd = os.open(os.path.join(top, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
"""


def _meminfo_used() -> int:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def _children() -> dict[int, list[int]]:
    """pid -> its child pids, from /proc/<pid>/stat (field 4: ppid)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, ()))
    return found


def _proc_fields(pid: int) -> dict[str, int | str]:
    """VmHWM/VmRSS (bytes), /proc/<pid>/io's counters and the command line of `pid`."""
    out: dict[str, int | str] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                name, value = line.split(":")
                out[name] = int(value)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            out["cmd"] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        pass
    return out


class Sampler:
    """Samples, every SAMPLE_SECONDS while a command runs: the machine's used memory, and
    each of the command's processes' peak RSS and I/O counters (the last sample of each)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.before = _meminfo_used()
        self.peak_used = self.before
        self.peak_rss_sum = 0  # the command's processes' VmRSS summed in one sample: what other work cannot move
        self.procs: dict[int, dict[str, int | str]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            self.peak_used = max(self.peak_used, _meminfo_used())
            rss_sum = 0
            for pid in _descendants(self.pid):
                fields = _proc_fields(pid)
                if not fields:
                    continue
                seen = self.procs.setdefault(pid, {})
                rss = max(int(fields.get("VmHWM", 0)), int(fields.get("VmRSS", 0)), int(seen.get("max_rss", 0)))
                # An exited process not yet waited for (a zombie) has no command line or
                # memory left: its last sample keeps what the live one said.
                for name, value in fields.items():
                    if isinstance(value, str):
                        seen[name] = value or seen.get(name, "")
                    else:
                        seen[name] = max(value, int(seen.get(name, 0)))
                seen["max_rss"] = rss
                rss_sum += int(fields.get("VmRSS", 0))
            self.peak_rss_sum = max(self.peak_rss_sum, rss_sum)
            self.done.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _measure(argv: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Run `argv`; its wall seconds, exit, output, the machine's peak used memory above the
    start, and the sampled processes (the command's own max RSS from its rusage too)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid)
    out, err = proc.communicate()
    seconds = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.stop()
    cpu = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
    return {"seconds": seconds, "cpu": cpu, "rc": proc.returncode, "out": out, "err": err,
            "memory": max(0, sampler.peak_used - sampler.before), "rss_sum": sampler.peak_rss_sum,
            "procs": sampler.procs}


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _role(cmd: str) -> str:
    if "tpubuild.workers.process" in cmd or "workers/process.py" in cmd:
        return "worker"
    if "-m tpubuild" in cmd:
        return "build"
    if " -c " in cmd:
        return "python -c"
    return cmd.split()[0] if cmd.split() else "?"  # a process that exited before its command line was read


def _print_procs(procs: dict[int, dict[str, int | str]]) -> None:
    for pid, p in sorted(procs.items()):
        print(f"    pid {pid:<7} {_role(str(p.get('cmd', '?'))):<8} max RSS {_mib(int(p.get('max_rss', 0))):>10}   "
              f"read {_mib(int(p.get('rchar', 0)))} ({_mib(int(p.get('read_bytes', 0)))} from disk), "
              f"written {_mib(int(p.get('wchar', 0)))} ({_mib(int(p.get('write_bytes', 0)))} to disk)")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,8", help="comma-separated model sizes, GiB of float32 (default 2,8)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (the exports are reused)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that builds (default this one)")
    parser.add_argument("--pythonpath", help="PYTHONPATH of the build (another checkout: a before/after)")
    parser.add_argument("--saved-model", type=Path, action="append", default=[],
                        help="also measure this SavedModel (a model no tpubuild developer wrote, with a `tpu_func` "
                             "alias), with the same recipe; repeatable. `--sizes ''` measures only these")
    parser.add_argument("--rtol", type=float, help="verify's rtol in the recipes (default: verify's own)")
    args = parser.parse_args()
    ws = args.keep or Path(tempfile.mkdtemp(prefix="tpubuild-large-models-"))
    (ws / "recipes").mkdir(parents=True, exist_ok=True)
    (ws / "export.py").write_text(EXPORT)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    build_env = dict(env)
    if args.pythonpath is not None:
        build_env["PYTHONPATH"] = args.pythonpath
    # From the workspace, as the build runs: `python -c` puts its directory first on sys.path.
    where = subprocess.run([args.python, "-c", "import tpubuild; print(tpubuild.__file__)"], env=build_env,
                           cwd=ws, capture_output=True, text=True).stdout.strip()
    print(f"workspace {ws}; build's python {args.python}, tpubuild from {where}; {os.cpu_count()} CPUs, "
          f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB")
    sizes = [float(s) for s in args.sizes.split(",") if s]
    names = []
    for size in sizes:
        n = int(math.sqrt(size * 2**30 / 4 / LAYERS))
        name = f"dense_{size:g}gib"
        names.append((size, n, name))
    for given in args.saved_model:
        # Linked into the workspace (a recipe's saved_model: is read inside it), one inode per file.
        name = "given_" + given.resolve().name.replace("-", "_").replace(".", "_")
        linked = ws / "sources" / name
        if not linked.is_dir():
            shutil.copytree(given, linked, copy_function=os.link)
        names.append((_size(linked) / 2**30, 0, name))
    rtol = "" if args.rtol is None else f", rtol: {args.rtol}"
    for stale in (ws / "recipes").glob("*.yaml"):
        stale.unlink()  # this script's own recipes of an earlier --keep run
    for size, n, name in names:  # every recipe first: a build validates all of the workspace's
        (ws / "recipes" / f"{name}.yaml").write_text(RECIPE.format(name=name, rtol=rtol))
    for size, n, name in names:
        source = ws / "sources" / name
        if not (source / "saved_model.pb").is_file():
            shutil.rmtree(source, ignore_errors=True)
            t = time.monotonic()
            subprocess.run([sys.executable, "export.py", str(source), str(n), str(LAYERS)], cwd=ws, env=env,
                           check=True, capture_output=True)
            print(f"exported {name} ({LAYERS} x {n} x {n}): {time.monotonic() - t:.1f} s, {_mib(_size(source))}")
    for size, n, name in names:
        source = ws / "sources" / name
        shape = f"{LAYERS} x {n} x {n} float32" if n else "given SavedModel"
        print(f"\n{name}: {shape}, {_mib(_size(source))} on disk")
        floor_dir = ws / "floor" / name
        floors = {}
        for label, code in (("load + save (fresh process)", FLOOR), ("load + save + fsync (durable)", FLOOR_DURABLE)):
            shutil.rmtree(floor_dir, ignore_errors=True)
            os.sync()  # the last run's dirty pages written back: not charged to this one
            floors[label] = measured = _measure([sys.executable, "-c", code, str(source), str(floor_dir)], ws, env)
            shutil.rmtree(floor_dir, ignore_errors=True)
            print(f"  {label:<29}{measured['seconds']:7.1f} s ({measured['cpu']:.1f} s CPU)   "
                  f"peak used memory +{_mib(measured['memory'])}   peak RSS of its processes together "
                  f"{_mib(measured['rss_sum'])}" + ("" if measured["rc"] == 0 else
                                                  f"   FAILED: {(measured['err'].strip().splitlines() or ['?'])[-1]}"))
            _print_procs(measured["procs"])
        floor, durable = floors.values()
        os.sync()
        # Cold: nothing of an earlier run in the cache or out/ (the exports stay).
        shutil.rmtree(ws / ".tpubuild", ignore_errors=True)
        shutil.rmtree(ws / "out" / name, ignore_errors=True)
        build = _measure([args.python, "-m", "tpubuild", "build", "--json", name], ws, build_env)
        try:
            rows = json.loads(build["out"])["rows"]
        except ValueError:
            rows = []
        print(f"  cold tpubuild build          {build['seconds']:7.1f} s ({build['cpu']:.1f} s CPU)   peak used memory +{_mib(build['memory'])}"
              f"   peak RSS of its processes together {_mib(build['rss_sum'])}"
              + ("" if build["rc"] == 0 else f"   FAILED (exit {build['rc']}): "
                 f"{(build['err'].strip().splitlines() or ['?'])[-1]}"))
        _print_procs(build["procs"])
        print("    (a process's counters include those of every child it waited for: the kernel adds a reaped "
              "child's to its parent's, so the build's hold its finished workers')")
        accounted = any(row.get("io") for row in rows)
        for row in rows:
            io = row.get("io") or {}
            print(f"    {row['stage']:<16} {row['status']:<7} {row['seconds']:7.2f} s"
                  + (f"   peak RSS {_mib(row['peak_rss_bytes'])}" if row.get("peak_rss_bytes") else "")
                  + (f"   read {_mib(io.get('rchar'))} ({_mib(io.get('read_bytes'))} from disk), written "
                     f"{_mib(io.get('wchar'))} ({_mib(io.get('write_bytes'))} to disk)" if io else ""))
        if not accounted:
            print("    (this build's rows carry no `io`: bytes per process above, from /proc/<pid>/io)")
        if build["rc"] != 0 or floor["rc"] != 0 or durable["rc"] != 0:
            print("  -> no ratio: a run above failed (its figures measure a part of the work)")
            continue
        time_x = build["seconds"] / floor["seconds"]
        cpu_x = build["cpu"] / max(floor["cpu"], 1e-9)
        memory_x = build["memory"] / max(floor["memory"], 1)
        rss_x = build["rss_sum"] / max(floor["rss_sum"], 1)
        print(f"  -> build / load+save: {time_x:.2f}x time (goal <= {GOAL_TIME}x: "
              f"{'met' if time_x <= GOAL_TIME else 'NOT met'}; CPU {cpu_x:.2f}x), {memory_x:.2f}x peak memory (goal <= {GOAL_MEMORY}x: "
              f"{'met' if memory_x <= GOAL_MEMORY else 'NOT met'}; by the processes' own RSS summed: {rss_x:.2f}x)")
        # Beside the goal's reference, not instead of it: what the build's time is against a
        # load+save whose writes are on the disk too.
        print(f"  -> build / load+save+fsync: {build['seconds'] / durable['seconds']:.2f}x time, "
              f"{build['memory'] / max(durable['memory'], 1):.2f}x peak memory")
    if not args.keep:
        shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    main()
