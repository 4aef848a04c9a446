"""A run's version: the local version published from its records (new, or the newest
one updated in place), its manifest and provenance (`attest`), and its publish to a
`publish_to:` destination. A part of `Engine` (engine/loop.py), as a mixin: it works on
the engine's store, stat cache, resolver and lock, and says what it did through the
engine's events.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tpubuild import __version__
from tpubuild.digests import StatCache, toolchain
from tpubuild.engine.events import Row
from tpubuild.engine.resolver import Output, Pending, RecipeRun, Resolver, published_targets, run_inputs
from tpubuild.errors import StageError
from tpubuild.provenance.digests import dependency_digests
from tpubuild.publish import split_by_target
from tpubuild.store import Store

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace
    from tpubuild.remote import RemoteCache

__all__ = ["RunVersion", "git_commit"]


class RunVersion:
    """The version part of `Engine`; its state is made by `Engine.__init__`."""

    ws: Workspace
    store: Store
    stat: StatCache
    resolver: Resolver
    state_lock: threading.RLock
    link_type: str
    remote: RemoteCache | None
    pending: dict[tuple[str, str], Pending]
    errors: Callable[[str], None]
    notes: Callable[[str], None]

    def row(self, run: RecipeRun, row: Row) -> None:
        raise NotImplementedError  # Engine.row

    def publish_uptodate(self, run: RecipeRun, start: float) -> bool:
        files, content, holding = self.resolver.published(run)
        number = holding.number if holding is not None and holding.intact else None
        if holding is not None and not holding.intact:
            # The newest version holds this content, damaged: a build restores it in place from
            # the store (planning and dry runs only say so: the query wrote nothing).
            from tpubuild.publish import repair_newest

            paths = [(f, self.store.object_path(f.hash)) for f in files]
            restored = repair_newest(Path(self.ws.output_dir) / run.name, holding, paths, self.stat, self.link_type)
            for path in restored or []:
                self.errors(f"{run.recipe.rel_file}: restored {self.ws.display(path)} (it no longer matched its manifest)")
            number = holding.number if restored is not None else None
        run.outputs["publish"] = Output.of("publish", self.resolver.publish_key(run, content), content,
                                           Path(self.ws.output_dir) / run.name, files)
        if number is None:
            self.pending[(run.name, "publish")] = Pending(None, None)
            return False
        run.version = number
        self.row(run, Row(run.name, "publish", "cached", run.outputs["publish"].key, time.monotonic() - start))
        return True

    def publish_version(self, run: RecipeRun) -> None:
        """A new version, or, when the newest one holds the same model (only the report's
        figures differ), that version with its report, manifest and provenance updated."""
        from tpubuild.publish import (
            newest_same_model,
            publish,
            reservation_file,
            update_version,
        )

        out = run.outputs["publish"]
        with self.state_lock:
            manifest = self.manifest(run, out.tree)
            paths = [(f, self.store.object_path(f.hash)) for f in out.files]
            same = newest_same_model(out.directory, manifest["model"])
            if same is not None:
                update_version(out.directory, same, paths, manifest, self.stat, self.link_type, finish=self.attest)
                run.version, run.updated_in_place = same, True
                return
            run.version = publish(out.directory, paths, manifest, self.ws.keep_versions, self.stat,
                                  link_type=self.link_type,
                                  warn=lambda m: self.errors(f"warning: {m}"), finish=self.attest,
                                  reservation=reservation_file(self.ws.state_dir, out.directory),
                                  known=self.store.known_object)

    def attest(self, version_dir: Path, manifest: dict[str, Any], target: str | None = None) -> None:
        """The provenance statement of a version (the main one, or a target version when
        `target` names it), and its signature when the workspace names a signing key
        (tpubuild/provenance/)."""
        from tpubuild.provenance import statement

        statement.write(version_dir, manifest, self.remote.url if self.remote is not None else None, target,
                        known=self.store.known_object)
        key = self.ws.signing_key
        if key is None:
            return
        if not key.is_file():
            self.errors(f"warning: signing.key {key} not found: {manifest['recipe']} version {manifest['version']} "
                        "published unsigned")
            return
        from tpubuild.provenance.signature import sign

        try:
            sign(version_dir, key, self.ws.signing_certificate, self.ws.signing_chain)
        except Exception as exc:  # noqa: BLE001 - the library's own error: one line, nothing published
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StageError(f"signing.key {key}: cannot sign {manifest['recipe']}: {first}") from None

    def manifest(self, run: RecipeRun, content: str) -> dict[str, Any]:
        """What a published version says of itself; the recipe-specific part of the
        artifact (cached outputs never name a recipe)."""
        publish = run.plan[-1]
        targets = published_targets(publish)
        main, by_target = split_by_target(run.outputs["publish"].files, sorted(targets))
        verdicts = dict(zip(targets, publish.summaries))  # plan order: each target's verify stage
        return {
            "recipe": run.name,
            "recipe_file": run.recipe.rel_file,
            "recipe_digest": run.recipe.digest,
            "content": content,
            # The content without the report's files and the targets' verdicts: what decides
            # whether a build publishes a new version (versions.newest_same_model).
            "model": self.resolver.model_digest(run, run.outputs["publish"].files),
            "files": {f.path: f.hash for f in main},
            # Each file's size: `tpubuild verify` compares it before hashing (a file larger
            # than listed is refused unread) and downloads no more (publish/version_check.py).
            "sizes": {f.path: f.size for f in main},
            # Each target version `<recipe>/<target>/<N>/`: its files, build facts and verdict.
            **({"targets": {
                target: {"files": {rel: f.hash for rel, f in by_target[target]},
                         "sizes": {rel: f.size for rel, f in by_target[target]},
                         "build": run.outputs[stage].summary,
                         "verify": run.outputs[verdicts[target]].summary}
                for target, stage in targets.items()}} if targets else {}),
            "stages": [{"stage": name, "key": out.key, "output": out.tree}
                       for name, out in run.outputs.items() if name != "publish"],
            "inputs": run_inputs(run),
            # The same inputs by the digests in-toto consumers read (provenance/digests.py).
            "input_digests": dependency_digests(Path(run.recipe.root), run_inputs(run),
                                                {out.tree: out.files for out in run.outputs.values()},
                                                self.store.object_path, self.store.known_object),
            "toolchain": toolchain(),
            "tpubuild": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git_commit": git_commit(self.ws.root),
            "report": run.outputs["report"].summary if "report" in run.outputs else {},
        }

    def publish_destinations(self, runs: list[RecipeRun]) -> None:
        """Publish the newest local version of each recipe that built (or had nothing to
        do) to its `publish_to:` destination, unless this workspace noted that it holds that
        model already (publish/to_destination.py). A destination that fails is said in one
        line per recipe and not contacted again in this build; the local build stays."""
        import json
        import shutil

        from tpubuild.errors import TpubuildError
        from tpubuild.publish import (
            DestinationError,
            note_place,
            open_destination,
            publish_to_destination,
            read_manifest,
            recorded,
            remember,
        )

        scratch = Path(self.ws.state_dir) / "publish-scratch"
        down: set[str] = set()  # destinations that failed: not asked again in this build
        destinations: dict[str, Any] = {}  # (URL, oci: settings) -> its Destination or OciDestination
        for run in runs:
            url = run.recipe.publish_to
            if url is None or not run.succeeded or run.version is None:
                continue
            version_dir = Path(self.ws.output_dir) / run.name / str(run.version)
            model = (read_manifest(version_dir) or {}).get("model")
            settings = run.recipe.oci if url.startswith("oci://") else {}
            noted = note_place(url, settings)  # an OCI format or base image of its own is another place
            if recorded(self.ws.state_dir, noted, run.name, model):
                continue
            kept = f"{self.ws.display(version_dir)} is kept"
            if url in down:
                run.destination_error = f"{run.recipe.rel_file}: not published to {url} (it failed, said above); {kept}"
                self.errors(run.destination_error)
                continue
            if not destinations:
                shutil.rmtree(scratch, ignore_errors=True)  # a killed build's
                scratch.mkdir(parents=True, exist_ok=True)
            place = json.dumps([url, settings], sort_keys=True)
            if place not in destinations:
                destinations[place] = open_destination(url, self.ws.remote_timeouts, settings)
            dest = destinations[place]
            labels = run.recipe.version_labels
            try:
                outcome = publish_to_destination(
                    dest, run.name, version_dir, scratch, keep=self.ws.keep_versions, pinned=set(labels.values()),
                    attest=self.attest, file_hash=lambda path: self.stat.file_hash(os.fspath(path)),
                    say=self.errors)
            except TpubuildError as exc:  # DestinationError; RemoteSetupError: no backend installed
                line = (str(exc).splitlines() or [type(exc).__name__])[0]
                # The store itself failed, or no backend is installed (RemoteSetupError): not asked again.
                if not isinstance(exc, DestinationError) or exc.unreachable:
                    down.add(url)
                run.destination_error = f"{run.recipe.rel_file}: not published: {line}; {kept}"
                self.errors(run.destination_error)
                continue
            except OSError as exc:  # the mount's own refusal the backend did not turn into a line
                down.add(url)
                what = f"{exc.strerror or type(exc).__name__}" + (f": {exc.filename}" if exc.filename else "")
                run.destination_error = f"{run.recipe.rel_file}: not published: publish_to {url}: {what}; {kept}"
                self.errors(run.destination_error)
                continue
            run.destination = outcome
            remember(self.ws.state_dir, noted, run.name, model, outcome.number)
            for line in outcome.mended:
                self.notes(f"{run.name}: {line}")
            where = outcome.version_url
            if outcome.new:
                self.notes(f"published: {run.name} -> {where}")
            else:
                self.notes(f"{run.name}: {where} holds this model already (nothing published there)")
            for number in outcome.pruned:
                self.notes(f"{run.name}: pruned {dest.version_url(run.name, number)} (keep_versions: "
                           f"{self.ws.keep_versions})")
        shutil.rmtree(scratch, ignore_errors=True)


def git_commit(root: Path) -> str | None:
    """The workspace's git HEAD, when it is a git checkout (recorded in the manifest)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
