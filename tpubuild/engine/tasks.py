"""The doit task graph: one task per (recipe, stage), chained by `task_dep`.

doit is used as a library: a TaskLoader2 builds the tasks from recipes and DoitMain runs
them, with threads for `-j N` (each thread hands its stage to a worker process).
tpubuild decides "cached or not" itself, by content keys (build.Engine), so the tasks
have no file_dep; doit's own dependency file is JSON under `.tpubuild/`, never a dbm
next to the user's files (doit #121, #380).

Recipes whose lock file proves them up to date never reach doit (build.build): loading
doit and checking 200 up-to-date tasks costs about as much as the whole no-op budget
(benchmarks/noop_build.py prints both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.engine.build import Engine, RecipeRun


def task_name(run: RecipeRun, stage: str) -> str:
    return f"{run.name}:{stage}"


def run_tasks(engine: Engine, runs: list[RecipeRun], jobs: int, dep_file: Path) -> int:
    """Run every stage of `runs` through doit; returns doit's exit code (0 unless a bug)."""
    from doit.cmd_base import TaskLoader2
    from doit.doit_cmd import DoitMain
    from doit.reporter import ZeroReporter
    from doit.task import Task

    tasks = []
    for run in runs:
        previous = None
        for planned in run.plan:
            tasks.append(
                Task(
                    task_name(run, planned.name),
                    actions=[(engine.run_stage, [run, planned])],
                    task_dep=[previous] if previous else [],
                    verbosity=2,  # doit must not swap sys.stdout under our threads
                )
            )
            previous = task_name(run, planned.name)

    class Loader(TaskLoader2):
        def setup(self, opt_values: dict[str, Any]) -> None:
            pass

        def load_doit_config(self) -> dict[str, Any]:
            return {"dep_file": str(dep_file), "backend": "json", "reporter": ZeroReporter, "verbosity": 2}

        def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
            return tasks

    dep_file.parent.mkdir(parents=True, exist_ok=True)
    argv = ["run"]
    if jobs > 1 and len(runs) > 1:
        argv += ["-n", str(jobs), "-P", "thread"]
    return DoitMain(Loader(), config_filenames=()).run(argv + [t.name for t in tasks])
