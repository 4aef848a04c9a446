"""Repairing and pruning a publish destination (a part of `Destination`,
publish/destination.py): what killed jobs left (sealed versions finished, stagings of
gone jobs removed), and versions pruned or cleaned, never one tpubuild did not publish.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tpubuild.publish.dest_claims import job_gone
from tpubuild.publish.dest_state import (
    CLAIMS,
    OWN,
    SEALED,
    STAGING,
    UNCLAIMED_AGE,
    DestinationError,
    Survey,
    Tree,
    commit_rels,
)
from tpubuild.publish.dest_survey import DestinationReading, all_files
from tpubuild.publish.dest_write import DestinationWriting
from tpubuild.publish.targets import MANIFEST


class DestinationMending(DestinationReading, DestinationWriting):
    """Mending finishes what writing began (a sealed version promoted, a staging removed)."""

    # --- what killed jobs left ------------------------------------------------------
    def mend(self, survey: Survey, say: Callable[[str], None]) -> list[str]:
        """Finish every sealed version (its bytes were checked; copying them again is
        harmless), and remove each unsealed staging whose job is gone: a job on this
        machine whose process ended, or one past its claim's budget (CLOCK_MARGIN after).
        Returns what was done, a line each."""
        done = []
        recipe = survey.recipe
        for number in sorted(survey.sealed):
            line = self._finish_seal(survey, number)
            if line:
                done.append(line)
        now = time.time()
        for number, newest in sorted(survey.staged.items()):
            if number in survey.sealed:
                continue
            claim = self.read_json(f"{recipe}/{CLAIMS}/{number}") if number in survey.claims else None
            if job_gone(claim, survey.claims.get(number), newest, now):
                # The survey is one listing taken earlier: the job may have sealed after it and
                # then died (the race test saw it on S3: its staging removed, its seal left with
                # nothing to complete). A job taken for gone writes nothing more, so its seal,
                # looked for now, is final: a sealed staging is finished, never removed.
                if self._seal_present(recipe, number):
                    line = self._finish_seal(survey, number)
                    if line:
                        done.append(line)
                    continue
                self.call(f"cannot remove {recipe}/{STAGING}/{number}",
                          lambda n=number: self.io.remove_tree(f"{recipe}/{STAGING}/{n}"))
                done.append(f"removed {self.base_path(recipe)}/{STAGING}/{number} (a publish that stopped before it "
                            f"was sealed; number {number} stays unused)")
        for rel, (number, written) in sorted(survey.temps.items()):
            # A seal's temp goes with its claim's job; a claim's temp, whose number another
            # job may hold, once a day old (a create takes milliseconds).
            if f"/{SEALED}/" in rel:
                claim = self.read_json(f"{recipe}/{CLAIMS}/{number}") if number in survey.claims else None
                gone = job_gone(claim, survey.claims.get(number), written, now)
            else:
                gone = now - written > UNCLAIMED_AGE
            if gone:
                self.call(f"cannot remove {rel}", lambda r=rel: self.io.delete([r]))
        for aside in sorted(survey.trash):  # a removal killed after its rename: nothing there is visible
            self.call(f"cannot remove {aside}", lambda a=aside: self.io.remove_tree(a))
        self.say_left()
        return done

    def _finish_seal(self, survey: Survey, number: int) -> str | None:
        """Complete the sealed version `number` (its bytes were checked when staged; copying
        them again is harmless), then remove its staging and seal. Returns the line to say
        when it completed a version; a seal that is not tpubuild's, or whose version cannot
        be completed, is said in one warning line and left (an orphan seal, whose staging is
        gone and whose version was never completed, is removed)."""
        recipe = survey.recipe
        seal = self.read_json(f"{recipe}/{SEALED}/{number}")
        if seal is None:
            return None  # finished and removed meanwhile
        try:
            # Every name in it is checked: a seal is data anyone who can write the destination wrote.
            if seal.get("recipe") != recipe or seal.get("number") != number:
                raise ValueError(f"it is not the seal of {recipe} version {number}")
            if not isinstance(seal.get("trees"), list) or not seal["trees"]:
                raise ValueError("its trees are not a list of trees")
            trees = [Tree.of(t, recipe, number) for t in seal["trees"]]
        except (TypeError, ValueError) as exc:
            self.warn(f"{recipe}/{SEALED}/{number} is not a seal tpubuild wrote ({exc}); left in place")
            return None
        line = None
        if not all(self._tree_whole(survey, t) for t in trees):
            try:
                self.promote(trees)
            except FileNotFoundError:
                return None  # its job finished and removed the staging meanwhile
            except DestinationError as exc:
                if exc.unreachable:
                    raise
                if self._orphan(recipe, number, trees):
                    self.call(f"cannot remove {recipe}/{SEALED}/{number}",
                              lambda: self.io.delete([f"{recipe}/{SEALED}/{number}"]))
                    return (f"removed {self.base_path(recipe)}/{SEALED}/{number} (its staging is gone and version "
                            f"{number} was never completed; number {number} stays unused)")
                # A directory tpubuild did not make at `<N>/`, say: never fatal to this build.
                self.warn(f"{recipe}/{SEALED}/{number}: cannot complete it ({str(exc).split(': ', 1)[-1]}); "
                          "left in place")
                return None
            line = f"completed {self.base_path(recipe)}/{number} (a publish that stopped before it was)"
        self.unstage(recipe, number)
        return line

    def _seal_present(self, recipe: str, number: int) -> bool:
        try:
            self.call(f"cannot read {recipe}/{SEALED}/{number}", lambda: self.io.size(f"{recipe}/{SEALED}/{number}"))
        except FileNotFoundError:
            return False
        return True

    def _orphan(self, recipe: str, number: int, trees: list[Tree]) -> bool:
        """Whether a seal can never be completed, looked at now: nothing of its staging is
        left and none of its versions holds its commit file (the one a job that finished it
        copies last, before it removes the staging). Such a seal is what a staging removed
        under a job that sealed after the remover's listing left (before that was fixed)."""
        staging = self.call(f"cannot list {recipe}/{STAGING}/{number}/",
                            lambda: self.io.list(f"{recipe}/{STAGING}/{number}/"))
        if any(rel.startswith(f"{recipe}/{STAGING}/{number}/") for rel, _size, _mtime in staging):
            return False
        for tree in trees:
            listed = self.call(f"cannot list {tree.final}/", lambda t=tree: self.io.list(f"{t.final}/"))
            if any(rel in (f"{tree.final}/{name}" for name in tree.commit) for rel, _size, _mtime in listed):
                return False
        return True

    def _tree_whole(self, survey: Survey, tree: Tree) -> bool:
        """Whether the listing shows every file of `tree` (checked by Tree.of) whole."""
        parts = tree.final[len(survey.recipe) + 1:].split("/")
        number = int(parts[-1])
        listed = survey.versions.get(number, {}) if len(parts) == 1 else \
            survey.targets.get(parts[0], {}).get(number, {})
        return all(listed.get(name) == size for name, (size, _) in tree.files.items())

    # --- pruning and cleaning -------------------------------------------------------
    def published_reason(self, survey: Survey, number: int) -> str | None:
        """None when `<recipe>/<N>/` (and each target version of N) is a version tpubuild
        published: its manifest names the recipe and lists exactly the files there."""
        manifest = self.manifest(survey.recipe, number)
        if manifest is None:
            return f"no readable {MANIFEST}"
        if manifest.get("recipe") != survey.recipe:
            return f"its {MANIFEST} is for recipe {repr(manifest.get('recipe'))[:100]}"
        listed = all_files(manifest)
        if listed is None:
            return f"its {MANIFEST} is not one tpubuild writes"
        if set(survey.versions.get(number, {})) - set(OWN) != {k[1:] for k in listed if k.startswith("\0")}:
            return f"it holds other files than its {MANIFEST} lists"
        for target in sorted({k.split("\0")[0] for k in listed} - {""}):
            present = survey.targets.get(target, {}).get(number)
            files = {k.split("\0", 1)[1] for k in listed if k.startswith(f"{target}\0")}
            if present is not None and set(present) - set(OWN) != files:
                return f"{target}/{number}/ holds other files than its {MANIFEST} lists"
        return None

    def newest_published(self, survey: Survey) -> int | None:
        """The newest complete version tpubuild published (published_reason says None)."""
        for number in reversed(survey.complete_numbers()):
            if self.published_reason(survey, number) is None:
                return number
        return None

    def remove_version(self, survey: Survey, number: int) -> None:
        """Target versions first, then the main one (publish's order reversed); in each, the
        commit file before the rest."""
        recipe = survey.recipe
        for target in sorted(survey.targets):
            if number in survey.targets[target]:
                self.call(f"cannot remove {recipe}/{target}/{number}",
                          lambda t=target: self.io.remove_tree(f"{recipe}/{t}/{number}/", first=commit_rels(
                              f"{recipe}/{t}/{number}")))
        self.call(f"cannot remove {recipe}/{number}",
                  lambda: self.io.remove_tree(f"{recipe}/{number}/", first=commit_rels(f"{recipe}/{number}")))
        self.say_left()

    def prune(self, survey: Survey, keep: int | None, pinned: set[int], say: Callable[[str], None],
              everything: bool = False) -> list[int]:
        """Remove the complete versions tpubuild published but the newest `keep` (all but
        the newest with `everything`: `clean`), never the newest nor a pinned one; a
        version that is not tpubuild's is left and said. The newest version TF Serving can
        load always stays: the newest complete one (a decimal int64: survey), and the newest
        tpubuild published, should a co-writer's newer one not load."""
        numbers = survey.complete_numbers()
        if not numbers or (keep is None and not everything):
            return []
        if everything:
            newest = numbers[-1:]
        else:
            assert keep is not None  # returned above when None
            newest = numbers[-keep:]
        kept = set(newest) | set(pinned)
        ours = self.newest_published(survey)
        if ours is not None:
            kept.add(ours)
        removed = []
        for number in numbers:
            if number in kept:
                continue
            why = self.published_reason(survey, number)
            if why is not None:
                say(f"warning: {self.base_path(survey.recipe)}/{number}: {why}; left in place")
                continue
            self.remove_version(survey, number)
            removed.append(number)
        return removed
