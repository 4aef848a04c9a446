"""Writing a version to a publish destination (a part of `Destination`,
publish/destination.py): a number claimed create-only, the trees staged and checked
object by object, sealed, then promoted under `<N>/` commit file last.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tpubuild.fs import INT64_MAX
from tpubuild.publish.dest_claims import whoami
from tpubuild.publish.dest_state import (
    CLAIMS,
    MAX_CLAIM_TRIES,
    SEALED,
    STAGING,
    DestinationBase,
    DestinationError,
    Survey,
    Tree,
)


class DestinationWriting(DestinationBase):
    # --- numbers --------------------------------------------------------------------
    def claim(self, survey: Survey, budget: float) -> int:
        """A number no one else has or will have: one more than every number the listing
        shows (claims, versions, stagings), taken by a create-only claim object; when
        another job took it first, the next one. `budget`: the seconds this job gives
        itself to seal its staging (a cleaner waits that long, and CLOCK_MARGIN, before
        taking the job for gone)."""
        number = max(survey.used(), default=0) + 1
        if number + MAX_CLAIM_TRIES > INT64_MAX:  # unreachable after survey's MAX_GAP rule, but never past int64
            raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number left within int64")
        document = json.dumps({**whoami(), "budget": round(budget, 1), "claimed": time.time()},
                              sort_keys=True).encode()
        for _ in range(MAX_CLAIM_TRIES):
            rel = f"{survey.recipe}/{CLAIMS}/{number}"
            if self.call(f"cannot claim version {number}", lambda r=rel: self.io.create(r, document)):
                survey.claims[number] = time.time()
                return number
            number += 1
        raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number free after "
                               f"{MAX_CLAIM_TRIES} tries (other jobs claimed them first)")

    # --- staging, sealing, promoting ------------------------------------------------
    def stage(self, trees: list[tuple[Tree, Path]], scratch: Path, deadline: float) -> None:
        """Upload each tree's files from its local directory to its staging name, then read
        every object back and check its size and BLAKE3. `deadline` (time.monotonic()): past
        it nothing more is written (a cleaner may take the claim for gone)."""
        from tpubuild import progress

        total = sum(size for tree, _ in trees for size, _digest in tree.files.values())
        with progress.meter(f"uploading to {self.url}", total):  # on a terminal: bytes sent, rate
            for tree, local in trees:
                for rel in sorted(tree.files):
                    _before(deadline, self.url)
                    source, staged = os.fspath(local / rel), f"{tree.staged}/{rel}"
                    self.call(f"cannot upload {staged}", lambda s=source, d=staged: self.io.upload(s, d))
        with progress.meter(f"reading back from {self.url}", total):
            self._read_back(trees, scratch, deadline)

    def _read_back(self, trees: list[tuple[Tree, Path]], scratch: Path, deadline: float) -> None:
        """stage's check: every object read back, its size and BLAKE3 the local file's."""
        from tpubuild.digests import hash_file
        from tpubuild.progress import uncounted

        for tree, _local in trees:
            for rel, (size, digest) in sorted(tree.files.items()):
                _before(deadline, self.url)
                probe, staged = os.fspath(scratch / "read-back"), f"{tree.staged}/{rel}"
                try:
                    # More bytes than were sent: ObjectTooLarge, said by `call` as one line.
                    got = self.call(f"cannot read back {staged}",
                                    lambda s=staged, p=probe, n=size: self.io.download(s, p, n))
                except FileNotFoundError:
                    raise DestinationError(f"publish_to {self.url}: {tree.staged}/{rel} vanished after its upload "
                                           "(removed by another job that took this one for gone?)") from None
                with uncounted():  # bytes counted as they were read back
                    same = got == size and hash_file(probe) == digest
                if not same:
                    raise DestinationError(f"publish_to {self.url}: {tree.staged}/{rel} does not read back as "
                                           f"uploaded ({got} bytes of {size}, or other bytes); nothing published")
                os.unlink(probe)

    def seal(self, recipe: str, number: int, trees: list[Tree], deadline: float) -> None:
        _before(deadline, self.url)
        document = json.dumps({"recipe": recipe, "number": number, "trees": [t.to_json() for t in trees]},
                              sort_keys=True).encode()
        rel = f"{recipe}/{SEALED}/{number}"
        if not self.call(f"cannot seal version {number}", lambda: self.io.create(rel, document)):
            raise DestinationError(f"publish_to {self.url}: {rel} exists: version {number} is another job's")

    def promote(self, trees: list[Tree]) -> None:
        """Make each staged tree visible under its final name, in order (the main version,
        then each target version). A directory is renamed whole. On an object store each
        object is copied, every one but the commit file first; they are checked present
        and whole in a listing; then the commit file is copied and checked. A staged
        object gone meanwhile means another job finished the version (mend): the tree
        must then be whole under its final name."""
        for tree in trees:
            try:
                self._promote_tree(tree)
            except FileExistsError:
                # `<N>/` is there already: another job finished it (then it is whole), or a
                # directory tpubuild did not make is (then nothing was written there).
                self.check_tree(tree, with_commit=True, wrote=False)
            except FileNotFoundError:
                self.check_tree(tree, with_commit=True)

    def _promote_tree(self, tree: Tree) -> None:
        if self.call(f"cannot rename {tree.staged}", lambda: self.io.rename_tree(tree.staged, tree.final)):
            return
        early = [rel for rel in sorted(tree.files) if rel not in tree.commit]
        for rel in early:
            self.call(f"cannot copy {tree.staged}/{rel}", lambda r=rel: self.io.copy(f"{tree.staged}/{r}",
                                                                                      f"{tree.final}/{r}"))
        self.check_tree(tree, with_commit=False)
        for rel in tree.commit:
            self.call(f"cannot copy {tree.staged}/{rel}", lambda r=rel: self.io.copy(f"{tree.staged}/{r}",
                                                                                      f"{tree.final}/{r}"))
        self.check_tree(tree, with_commit=True)

    def check_tree(self, tree: Tree, with_commit: bool, wrote: bool = True) -> None:
        """Every file of `tree` (its commit file too, when `with_commit`) listed under the
        final name with the size staged: a DestinationError naming the first that is not
        (`wrote`: whether this job copied anything there, for the message)."""
        listed = {rel[len(tree.final) + 1:]: size for rel, size, _ in
                  self.call(f"cannot list {tree.final}/", lambda: self.io.list(f"{tree.final}/"))
                  if rel.startswith(f"{tree.final}/")}
        for rel, (size, _digest) in sorted(tree.files.items()):
            if rel in tree.commit and not with_commit:
                continue
            if listed.get(rel) != size:
                seen = "missing" if rel not in listed else f"{listed[rel]} bytes, not {size}"
                if not wrote:
                    raise DestinationError(f"publish_to {self.url}: {tree.final}/ exists and is not this version "
                                           f"({rel} is {seen}: a directory tpubuild did not make?); nothing "
                                           "written there")
                raise DestinationError(f"publish_to {self.url}: {tree.final}/{rel} is {seen} after its copy; "
                                       f"{'its' if with_commit else 'no'} {tree.commit[0]} written")

    def unstage(self, recipe: str, number: int) -> None:
        """Remove a published version's staging, then its seal (either may be gone: the
        job that published it and one that finished it both remove them)."""
        for what, remove in ((f"{recipe}/{STAGING}/{number}", self.io.remove_tree),
                             (f"{recipe}/{SEALED}/{number}", lambda rel: self.io.delete([rel]))):
            try:
                self.call(f"cannot remove {what}", lambda w=what, r=remove: r(w))
            except FileNotFoundError:
                pass



def _before(deadline: float, url: str) -> None:
    if time.monotonic() > deadline:
        raise DestinationError(f"publish_to {url}: the upload took longer than its claim's budget; stopped before "
                               "sealing (the next publish removes the staging; the number stays unused)")
