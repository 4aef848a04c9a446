"""The one resolver: for each stage of a recipe, its key (taken before it runs) and the
stage record in the store that the key names, if any.

Builds (doit's up-to-date test and the execution after it), the no-op fast path,
`build --check`, `build --dry-run`, `explain`, lock files and manifests all read stage
state through this module, so they can never disagree. TensorFlow-free.

A key hashes the stage's code, toolchain, environment allow-list, option slice and the
digests of exactly the inputs it reads: workspace files (declared in its SPEC), the
outputs and summaries of the earlier stages it consumes, and, for stages that run user
code, the workspace modules that code imported last time (discovered inputs, kept in a
dep file per key like a compiler's `.d` file; the record is stored under a final key
that also hashes them).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.digests import (
    ABSENT,
    FileEntry,
    StatCache,
    current_input_hash,
    hash_bytes,
    tree_digest,
)
from tpubuild.errors import StageError
from tpubuild.fs import NotAFile
from tpubuild.keys import (
    StageEntry,
    canonical_dumps,
    code_digests,
    discovered_final_key,
    key_record,
    parse_candidate,
    stage_key,
    summary_digest,
)
from tpubuild.pipeline import (
    ENGINE_STEPS,
    STAGE_ORDER,
    TARGET_STAGES,
    PlannedStage,
    plan,
    spec,
    stage_module,
)
from tpubuild.pipeline import target as target_spec
from tpubuild.publish import MANIFEST

if TYPE_CHECKING:  # the store's module (sqlite, file locks) is not imported to compute keys: `build --check`
    from tpubuild.config.recipe import Recipe
    from tpubuild.config.workspace import Workspace
    from tpubuild.publish import Holding
    from tpubuild.store import Store


@dataclass
class Output(StageEntry):
    """A finished (or cached) stage: its record (what later keys hash), and the directory
    where later stages read it (its checkout, or the version directory of publish)."""

    directory: Path = field(default_factory=Path)

    @classmethod
    def of(cls, stage: str, key: str, tree: str, directory: Path, files: list[FileEntry] | None = None,
           **rest: Any) -> Output:
        return cls(key=key, stage=stage, tree=tree, files=list(files or []), directory=directory, **rest)


@dataclass
class RecipeRun:
    recipe: Recipe
    plan: list[PlannedStage]
    outputs: dict[str, Output] = field(default_factory=dict)
    rows: list[Any] = field(default_factory=list)
    error: str | None = None
    version: int | None = None
    # The publish step updated version `version` in place: the same model, re-measured
    # (publish/refresh.py); no new version was published.
    updated_in_place: bool = False
    # With `build --keep-going`: target -> why its chain failed; the rest still publishes.
    failed_targets: dict[str, str] = field(default_factory=dict)
    # Its publish destination (`publish_to:`): the version there that holds the model
    # (publish/dest_state.py Outcome), or why it could not be published there.
    destination: Any = None
    destination_error: str | None = None
    # What a failed stage measured before it failed (verify's errors): engine/history.py.
    failed_summaries: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.failed_targets

    @property
    def failed(self) -> bool:
        return self.error is not None


def new_runs(recipes: list[Recipe]) -> list[RecipeRun]:
    return [RecipeRun(r, plan(r.canonical)) for r in recipes]


@dataclass
class Pending:
    """A stage the resolver cannot take from the store: its record (when its inputs are
    known) and the stats of the declared files it hashed, checked again after the run."""

    record: dict[str, Any] | None
    key: str | None
    file_stats: dict[str, tuple] = field(default_factory=dict)
    error: str | None = None  # an input could not be read: the stage fails with this
    detail: str | None = None


class Resolver:
    def __init__(self, ws: Workspace, store: Store | None, stat: StatCache):
        """`store` None: keys only (engine/lockcheck.py), never a look in a store."""
        self.ws = ws
        self._store = store
        self.stat = stat
        names = [name for name in STAGE_ORDER if name not in ENGINE_STEPS]
        digests = code_digests([stage_module(n) for n in names], Path(ws.state_dir) / "code-digests.json")
        self.codes = {name: digests[stage_module(name)] for name in names}
        # The engine's own steps: a snapshot copy and a publish (not cached in the store).
        self.codes["source"] = self.codes["publish"] = "engine"
        self._entries: dict[str, StageEntry] = {}
        self._distrusted: set[Path] = set()  # dep files said to be (partly) ignored

    # --- inputs -------------------------------------------------------------------
    def expand(self, recipe: Recipe, patterns: list[str]) -> list[str]:
        return expand_inputs(Path(recipe.root), patterns)

    def file_inputs(self, run: RecipeRun, planned: PlannedStage) -> tuple[dict[str, str], dict[str, tuple]]:
        """`file:<path>` -> hash of the declared files, and their stats (re-checked after the run)."""
        hashes, stats = {}, {}
        for rel in self.expand(run.recipe, planned.files):
            path = os.path.join(run.recipe.root, rel)
            st = os.stat(path)
            hashes[f"file:{rel}"] = self.stat.file_hash(path, st)
            stats[rel] = _stat_tuple(st)
        return hashes, stats

    def source_tree(self, recipe: Recipe) -> tuple[str, list[FileEntry], Path]:
        rel = recipe.canonical["model"]["saved_model"]
        directory = Path(recipe.root) / rel
        if not directory.is_dir():
            raise StageError(f"model.saved_model: {rel} is not a directory")
        if not (directory / "saved_model.pb").is_file():
            from tpubuild.savedmodel.proto_limit import cpb_hint

            raise StageError(f"model.saved_model: {rel} holds no saved_model.pb{cpb_hint(directory)}")
        tree, files = self.stat.tree(directory)
        return tree, files, directory

    def record_for(self, run: RecipeRun, planned: PlannedStage) -> Pending:
        """The stage's key record from the current inputs; every consumed earlier stage
        must be resolved already (doit's task order, or the planning walk)."""
        name = planned.name
        if name == "source":
            tree = self.source_tree(run.recipe)[0]
            inputs = {f"dir:{planned.options['saved_model']}": tree}
            record = key_record(name, self.codes[name], planned.options, inputs, environ=None)
            return Pending(record, stage_key(record))
        inputs, stats = self.file_inputs(run, planned)
        for role, stage in planned.consumes.items():
            inputs[f"{role}:{stage}"] = run.outputs[stage].tree
        for stage in planned.summaries:
            out = run.outputs[stage]
            inputs[f"summary:{stage}"] = summary_digest(out.summary, out.warnings)
        record = key_record(name, self.codes[name], planned.options, inputs)
        return Pending(record, stage_key(record), stats)

    # --- records in the store -----------------------------------------------------
    def entry(self, key: str) -> StageEntry | None:
        """The record under `key`; hits are remembered for this command (records are
        immutable), misses are not (another recipe's task may store it next)."""
        if key not in self._entries:
            found = self.store.get(key)
            if found is None:
                return None
            self._entries[key] = found
        return self._entries[key]

    def lookup(self, run: RecipeRun, planned: PlannedStage, pending: Pending, verify: bool = True) -> StageEntry | None:
        """The stored record of this stage run, if there is one whose inputs (declared and
        discovered) all match; its objects are verified (a damaged one is a miss)."""
        assert pending.key is not None
        key = pending.key
        if planned.name not in ENGINE_STEPS and spec(planned.name).discovers:
            final = self.discovered_key(run, pending.key)
            if final is None:
                return None
            key = final
        entry = self.entry(key)
        if entry is None:
            return None
        if verify and not self.store.verify(entry, self.stat):
            self._entries.pop(key, None)
            return None
        return entry

    def depfile(self, key: str) -> Path:
        return self.store.dep_file(key)

    def discovered_key(self, run: RecipeRun, key: str) -> str | None:
        """The final key of the candidate whose discovered files all still have the
        content that was imported, newest candidate first."""
        match = self.matching_candidate(run, reversed(self.candidates(key)))
        return match["key"] if match else None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("this resolver computes keys only: it has no store")
        return self._store

    def candidates(self, key: str) -> list[dict[str, Any]]:
        """The discovered-input candidates of the dep file of `key`, oldest first, each one's
        final key recomputed from its files (records.parse_candidate): the dep file is as
        writable as the cache and carries no MAC, so a candidate that names another key is
        said once and never used. A link or a special file in its place is not read."""
        path = self.depfile(key)
        try:
            raw = self.store.read_dep_file(key)  # through the store's no-follow layer (store/depfiles.py)
            if raw is None:
                return []
            data = json.loads(raw)
        except NotAFile:  # a symbolic link (not followed), a FIFO (not waited on)...
            self._distrust(path, "not a regular file")
            return []
        except OSError as exc:
            self._distrust(path, exc.strerror or type(exc).__name__)
            return []
        except ValueError:
            self._distrust(path, "not JSON")
            return []
        found = [c for c in (parse_candidate(key, item) for item in (data if isinstance(data, list) else [])) if c]
        if not isinstance(data, list) or len(found) != len(data):
            self._distrust(path, f"{len(data) - len(found) if isinstance(data, list) else 'no'} candidate(s) "
                                 "whose key is not the final key of their files (not written by tpubuild)")
        return found

    def _distrust(self, path: Path, why: str) -> None:
        """Say once that (part of) a dep file is not used; the stage's next build rewrites it."""
        if self.store is not None and path not in self._distrusted:
            self._distrusted.add(path)
            self.store.report(f"warning: cache dep file {path}: {why}; ignored")

    def matching_candidate(self, run: RecipeRun, candidates: Any) -> dict[str, Any] | None:
        """The first candidate ({"files": {path: hash}, "key": final key}) whose discovered
        files all still have the content that was imported (local or remote candidates)."""
        for candidate in candidates:
            # A file recorded absent (workers/import_record.py: where an import looked) matches only
            # while it is still missing.
            if all((self.current_hash(run, rel) or ABSENT) == digest for rel, digest in candidate["files"].items()):
                return candidate
        return None

    def remember(self, entry: StageEntry) -> None:
        """A record that entered the store from elsewhere (the remote cache)."""
        self._entries[entry.key] = entry

    def discovered_changes(self, run: RecipeRun, discovered: dict[str, str], declared: set[str]) -> list[str]:
        """What changed among the inputs a stage discovered last time (workers/import_record.py):
        modules its user code imported, installed packages it named, and the paths where an
        import looked and found nothing, which matter only if a file appears there. A file
        that is also a declared input (`declared`: key-record input names) is left to the
        records' difference, which names it once. `explain` and `build --check` say these."""
        changes = []
        for rel, then in sorted(discovered.items()):
            if f"file:{rel}" in declared:
                continue
            now = self.current_hash(run, rel) or ABSENT
            if now == then:
                continue
            if rel.startswith("dist:"):
                package = rel[len("dist:"):]
                change = "uninstalled" if now == ABSENT else f"{then} -> {now}"
                changes.append(f"installed package {package}: {change}")
            elif then == ABSENT:
                changes.append(f"module {rel}: created where an import looked last time and found nothing")
            elif now == ABSENT:
                changes.append(f"imported module {rel}: removed")
            else:
                changes.append(f"imported module {rel}: content changed ({then[:12]} -> {now[:12]})")
        return changes

    def current_hash(self, run: RecipeRun, rel: str) -> str | None:
        """The hash a key-record input has now (a file, a directory's tree, an installed
        distribution's version): what `explain` compares with the recorded one."""
        return current_input_hash(run.recipe.root, self.stat, rel)

    def add_discovered(self, key: str, discovered: dict[str, str]) -> str:
        """Record a candidate (files -> hashes) for `key`; returns the final key. Only
        candidates that check (`candidates`) are kept."""
        final = discovered_final_key(key, discovered)
        candidates = [c for c in self.candidates(key) if c["key"] != final][-15:]  # bounded
        candidates.append({"files": discovered, "key": final})
        self.store.write_dep_file(key, json.dumps(candidates, sort_keys=True))
        return final

    def output_of(self, planned: PlannedStage, entry: StageEntry, directory: Path) -> Output:
        return Output.of(planned.name, entry.key, entry.tree, directory, entry.files, summary=entry.summary,
                         warnings=list(entry.warnings), record=entry.record, peak_memory=entry.peak_memory)

    # --- publish ------------------------------------------------------------------
    def publish_files(self, run: RecipeRun) -> list[FileEntry]:
        """The published tree: the final model, plus the files the report stage wrote, plus
        each target's build output named `<target>/<path>` (publish/targets.py);
        the warmup requests go into the model and into each SavedModel target."""
        planned = run.plan[-1]
        files = {f.path: f for f in run.outputs[planned.consumes["model"]].files}
        extras = [(name, f) for name in ("report", "warmup") if name in planned.consumes
                  for f in run.outputs[planned.consumes[name]].files]
        for name, f in extras:
            if f.path in files:
                raise StageError(f"{name} file {f.path} would overwrite a file of the model")
            files[f.path] = f
        targets = published_targets(planned)
        clash = sorted({path.split("/")[0] for path in files} & set(targets))
        if clash:
            raise StageError(f"the model has a top-level {clash[0]!r}, the name of the target published beside it")
        for target, stage in targets.items():
            if any(f.path == MANIFEST for f in run.outputs[stage].files):
                raise StageError(f"stage {stage} wrote {MANIFEST}, the name of the target version's manifest")
            for f in run.outputs[stage].files:
                files[f"{target}/{f.path}"] = FileEntry(f"{target}/{f.path}", f.hash, f.size)
            if "warmup" in planned.consumes and target_spec(target).savedmodel:
                for f in run.outputs[planned.consumes["warmup"]].files:
                    files.setdefault(f"{target}/{f.path}", FileEntry(f"{target}/{f.path}", f.hash, f.size))
        return sorted(files.values(), key=lambda f: f.path)

    def publish_content(self, run: RecipeRun, files: list[FileEntry]) -> str:
        """What a published version holds: its files and, with targets, each target's
        verification (in its manifest), so a new verdict is a new version."""
        content = tree_digest(files)
        verdicts = {name: run.outputs[name].tree for name in run.plan[-1].summaries}
        if verdicts:
            content = hash_bytes(canonical_dumps({"files": content, "verified": verdicts}).encode())
        return content

    def model_digest(self, run: RecipeRun, files: list[FileEntry]) -> str:
        """What a published version holds that is the model: every published file but the
        report stage's (figures measured on this machine, the HLO it printed), target
        files included. Two builds with the same model digest publish one version
        (versions.newest_same_model)."""
        planned = run.plan[-1]
        report = planned.consumes.get("report")
        measured = {f.path for f in run.outputs[report].files} if report in run.outputs else set()
        return tree_digest([f for f in files if f.path not in measured])

    def publish_key(self, run: RecipeRun, content: str) -> str:
        return hash_bytes(canonical_dumps({"stage": "publish", "recipe": run.name, "content": content}).encode())

    def published(self, run: RecipeRun) -> tuple[list[FileEntry], str, Holding | None]:
        """(files, content digest, the newest version when it holds that content, intact or
        damaged: publish.Holding). A query: a build repairs a damaged one (Engine)."""
        from tpubuild.publish import newest_holding

        files = self.publish_files(run)
        content = self.publish_content(run, files)
        return files, content, newest_holding(Path(self.ws.output_dir) / run.name, content, self.stat)

    def why_publish(self, run: RecipeRun) -> str:
        """Why the publish step would write a new version (the newest one does not hold the result)."""
        from tpubuild.publish import foreign_in_newest, newest_same_model

        recipe_dir = Path(self.ws.output_dir) / run.name
        foreign = foreign_in_newest(recipe_dir)
        if foreign:
            return (f"the newest published version holds what tpubuild did not write ({', '.join(foreign[:3])}); "
                    "a new version is published beside it")
        same = newest_same_model(recipe_dir, self.model_digest(run, self.publish_files(run)))
        if same is not None:
            return f"version {same} holds the same model with other figures: its report would be updated in place"
        return "the newest published version has other content (or none exists)"

    # --- planning -----------------------------------------------------------------
    def resolve(self, run: RecipeRun) -> list[Resolved]:
        """Each stage's state without running anything: a stage whose consumed outputs or
        summaries are all in the store is looked up by its key; one that reads a stage
        that would run is `pending` until that stage has run."""
        out: list[Resolved] = []
        waiting: list[str] = []  # stages that would run, in plan order
        for planned in run.plan:
            reads = set(planned.consumes.values()) | set(planned.summaries)
            blocked = next((name for name in waiting if name in reads), None)
            if blocked:
                out.append(Resolved(planned.name, "pending", None, None, [f"its input {blocked} will be rebuilt first"]))
                waiting.append(planned.name)
                continue
            if planned.name == "publish":
                _, content, holding = self.published(run)
                number = holding.number if holding is not None and holding.intact else None
                key = self.publish_key(run, content)
                if number is None:
                    out.append(Resolved("publish", "pending", key, None, [self.why_publish(run)], content))
                else:
                    run.version = number
                    out.append(Resolved("publish", "cached", key, None, [], content))
                continue
            try:
                pending = self.record_for(run, planned)
                entry = self.lookup(run, planned, pending)
            except (StageError, OSError) as exc:
                message = str(exc) if isinstance(exc, StageError) else f"{exc.strerror}: {exc.filename}"
                out.append(Resolved(planned.name, "failed", None, None, [message]))
                waiting.append(planned.name)
                continue
            if entry is None:
                out.append(Resolved(planned.name, "pending", pending.key, pending.record))
                waiting.append(planned.name)
                continue
            run.outputs[planned.name] = self.output_of(planned, entry, self.store.trees / entry.tree)
            out.append(Resolved(planned.name, "cached", entry.key, entry.record, [], entry.tree))
        return out


def run_inputs(run: RecipeRun) -> dict[str, str]:
    """Every workspace input of the recipe, as its stage records hashed it before running:
    declared files, the source directory, and discovered imports (`import:<path>`)."""
    inputs: dict[str, str] = {}
    for out in run.outputs.values():
        for name, digest in out.record.get("inputs", {}).items():
            if name.startswith(("file:", "dir:")):
                inputs[name] = digest
        for rel, digest in out.record.get("discovered", {}).items():
            # Where imports looked and found nothing is in the stage's key, not in the
            # lock file a reviewer reads; code outside the workspace is named by path.
            if digest != ABSENT and not os.path.isabs(rel) and not rel.startswith("dist:"):
                inputs[f"import:{rel}"] = digest
    return dict(sorted(inputs.items()))


def measured_flags(stages: list[PlannedStage]) -> list[tuple[bool, bool]]:
    """(key_measured, measured) of each planned stage: its output may differ between
    machines (its own `machine_dependent`, or a key that hashes such an output), and its
    key hashes a measured output. What lock files mark, and compare by name only."""
    flags = []
    measured: set[str] = set()
    for planned in stages:
        reads = set(planned.consumes.values()) | set(planned.summaries)
        key_measured = bool(reads & measured)  # a key hashes the outputs it reads
        own = planned.name not in ENGINE_STEPS and spec(planned.name).machine_dependent(planned.options)
        if own or key_measured:
            measured.add(planned.name)
        flags.append((key_measured, planned.name in measured))
    return flags


def without_targets(publish: PlannedStage, targets: set[str]) -> PlannedStage:
    """The publish step without `targets` (their outputs and verdicts): --keep-going."""
    import dataclasses

    dropped = {stage for t in targets for stage in TARGET_STAGES[t]}
    return dataclasses.replace(
        publish, consumes={role: stage for role, stage in publish.consumes.items() if role not in targets},
        summaries=tuple(s for s in publish.summaries if s not in dropped))


def published_targets(publish: PlannedStage) -> dict[str, str]:
    """Target -> its build stage, for the targets the publish step publishes."""
    return {role: stage for role, stage in publish.consumes.items() if role in TARGET_STAGES}


@dataclass
class Resolved:
    name: str
    status: str  # cached | pending (would run) | failed (an input is missing)
    key: str | None
    record: dict[str, Any] | None
    reasons: list[str] = field(default_factory=list)
    output: str | None = None
    # What engine/explain.py adds for `explain` and `build --check`. A stage waiting for
    # one that would run: cached if these stages' outputs come out unchanged (early
    # cutoff), or skipped because this earlier stage cannot run.
    cached_if_unchanged: tuple[str, ...] = ()
    stopped_by: str | None = None
    # The lock file's record of the stage is not in the cache (a fresh clone, gc): what
    # changed since then, if anything, cannot be told from keys.
    unknown: bool = False


def expand_inputs(root: Path, patterns: list[str], keep_missing: bool = False) -> list[str]:
    """Workspace-relative files named by `patterns` (globs expanded, sorted). A named file
    that does not exist is a StageError, or kept with `keep_missing` (`tpubuild diff`:
    the stage will fail on it, and the plan still reads it)."""
    found: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = glob.glob(os.path.join(root, pattern), recursive=True)
            found.extend(Path(os.path.relpath(m, root)).as_posix() for m in matches if os.path.isfile(m))
        elif keep_missing or os.path.isfile(os.path.join(root, pattern)):
            found.append(pattern)
        else:
            raise StageError(f"input file {pattern} does not exist")
    return sorted(set(found))


def _stat_tuple(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed_inputs(root: Path, stats: dict[str, tuple], hashes: dict[str, str], stat: StatCache) -> list[str]:
    """Declared files whose content differs from what the key hashed (after a stage ran).
    A file whose stat is unchanged and was not modified within the racy window of its
    hashing is unchanged; anything else is rehashed."""
    import time

    changed = []
    now = time.time_ns()
    for rel, before in stats.items():
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            changed.append(rel)
            continue
        racy = now - before[4] < 3_000_000_000  # coarse timestamps: a same-tick rewrite keeps the stat
        if _stat_tuple(st) != before or racy:
            from tpubuild.digests import hash_file

            if hash_file(path, st.st_size) != hashes[f"file:{rel}"]:
                changed.append(rel)
    return changed
