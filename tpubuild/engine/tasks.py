"""The doit task graph: one task per (recipe, stage), with its real dependencies.

A stage's task depends on the tasks of exactly the earlier stages whose outputs or
summaries it consumes (its SPEC), so doit orders them and, with `-j N`, runs whatever
is ready in parallel (threads; each thread hands its stage to a worker process). The
up-to-date test of every task is the resolver's record lookup (Engine.uptodate); a task
whose inputs are unchanged never runs its action. doit's own state file is JSON under
`.tpubuild/`, never a dbm next to the user's files (doit #121, #380); tpubuild does not
rely on it (the records in the store decide).
"""

from __future__ import annotations

from typing import Any, Protocol

from tpubuild.engine.resolver import RecipeRun
from tpubuild.engine.timeline import traced_action, traced_uptodate
from tpubuild.pipeline import PlannedStage


class TaskEngine(Protocol):
    """What the task graph needs of the engine (engine/loop.py): a stage's action and
    its up-to-date test."""

    def action(self, run: RecipeRun, planned: PlannedStage) -> bool: ...

    def uptodate(self, run: RecipeRun, planned: PlannedStage) -> bool: ...


def task_name(run: RecipeRun, stage: str) -> str:
    return f"{run.name}:{stage}"


def make_tasks(engine: TaskEngine, runs: list[RecipeRun]) -> list[Any]:
    from doit.task import Task

    tasks = []
    for run in runs:
        for planned in run.plan:
            deps = sorted(set(planned.consumes.values()) | set(planned.summaries))
            tasks.append(
                Task(
                    task_name(run, planned.name),
                    # Through the timeline: with `build --profile`, each is an event of the trace.
                    actions=[(traced_action, [engine, run, planned])],
                    uptodate=[(traced_uptodate, [engine, run, planned])],
                    task_dep=[task_name(run, d) for d in deps],
                    verbosity=2,  # doit must not swap sys.stdout under our threads
                )
            )
    return tasks


class MemoryDB:
    """doit's dependency database, kept in memory only. tpubuild's store is the record of
    what was built (every task's up-to-date check is Engine.uptodate), so doit's own file
    held nothing a later build reads; and doit wrote it in place, not atomically, at the
    end of every build: on a full disk that write failed with a traceback."""

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None):
        self.name = name
        self._db: dict[str, dict[str, Any]] = {}

    def dump(self) -> None:
        pass

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        self._db.setdefault(task_id, {})[dependency] = value

    def get(self, task_id: str, dependency: str) -> Any:
        return self._db.get(task_id, {}).get(dependency)

    def in_(self, task_id: str) -> bool:
        return task_id in self._db

    def remove(self, task_id: str) -> None:
        self._db.pop(task_id, None)

    def remove_all(self) -> None:
        self._db = {}


def run_tasks(engine: TaskEngine, runs: list[RecipeRun], jobs: int) -> int:
    """Run every stage of `runs` through doit; returns doit's exit code."""
    from doit.cmd_base import TaskLoader2
    from doit.doit_cmd import DoitMain
    from doit.reporter import ZeroReporter

    tasks = make_tasks(engine, runs)

    class Loader(TaskLoader2):
        def setup(self, opt_values: dict[str, Any]) -> None:
            pass

        def load_doit_config(self) -> dict[str, Any]:
            return {"dep_file": "", "backend": "memory", "reporter": ZeroReporter, "verbosity": 2}

        def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
            return tasks

    # --continue: a failed stage stops only the tasks that depend on it (its recipe).
    argv = ["run", "--continue"]
    if jobs > 1:
        argv += ["-n", str(jobs), "-P", "thread"]
    backends = {"BACKEND": {"memory": f"{__name__}:MemoryDB"}}
    return DoitMain(Loader(), config_filenames=(), extra_config=backends).run(argv + [t.name for t in tasks])
