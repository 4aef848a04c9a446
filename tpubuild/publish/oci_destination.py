"""A publish destination that is an OCI registry's repository (`publish_to:
oci://HOST[:PORT]/REPO`): each recipe is the repository `REPO/<recipe>`, each version N its
tag `N` (a target's, `N` of `REPO/<recipe>/<target>`); numbers claimed with tags, versions
read, checked and pruned there. Above transport/oci.py (the distribution API); what a
version is byte for byte is publish/oci_format.py, one recipe's publish publish/oci_publish.py.
docs/publish-to-oci.md says all of it for users.

The claim of a number. The distribution spec has no conditional write: a manifest PUT to
a tag points the tag at it whatever it pointed at (distribution
registry/handlers/manifests.go PutManifest, then registry/storage/tagstore.go Tag, which
overwrites the tag's `current/link`). What it does have is a tag list that shows every
tag whose PUT was answered before the listing began (on distribution, the PUT writes the
tag's link file before it answers 201, and the list reads the tags directory of the same
storage: tagstore.go Tag, All). On that, a claim is:

1. list the tags; N is one above every number used (a decimal tag, or a claim's number);
2. push the claim tag `tpubuild-claim-<N>-<token>` (a token of this job's alone: no two
   jobs ever write one tag);
3. list the tags again: when this claim is the only claim of N and no tag `N` exists, N is
   this job's; else, after a random pause, the next number from that listing.

Two jobs A and B that both keep N: each listed (3) after its own claim was answered (2).
Say A's listing did not show B's claim: then B's claim was answered after A's listing
began, so after A's claim was answered, and B's listing, which began after B's claim was
answered, shows A's claim: B does not keep N. So at most one job keeps a number, whatever
the timing. Only that job ever writes the tag `N` (a version tag is never overwritten by
tpubuild; a PUT of the same bytes again, a retry, points it where it points), a claim is
removed only with its version when that is pruned, or by `clean --remote` a day after a
killed push left it below a newer version (the highest number's claims stay, so no number
is taken twice even when its version is deleted by hand), and a
kill at any moment leaves no tag `N` until the manifest, pushed last, is.
"""

from __future__ import annotations

import calendar
import json
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpubuild.errors import TpubuildError
from tpubuild.fs import INT64_MAX, version_number
from tpubuild.publish.dest_claims import whoami
from tpubuild.publish.dest_state import MAX_CLAIM_TRIES, MAX_GAP, UNCLAIMED_AGE, DestinationError
from tpubuild.publish.oci_format import (
    CLAIM_ARTIFACT,
    CLAIM_JOB,
    CLAIM_NUMBER,
    CLAIM_TAG,
    CREATED,
    EMPTY,
    EMPTY_DIGEST,
    FILEPATH,
    FORMATS,
    LAYER_ROLE,
    MANIFEST_DIGEST,
    MODEL_ARTIFACT,
    OCI_IMAGE_CONFIG,
    OCI_MANIFEST,
    RECIPE,
    VERSION,
    BaseImage,
    Blob,
    claim_manifest,
    claim_tag,
)

DOCUMENT_LIMIT = 4 << 20  # an image config, a ModelPack config
BASE_LAYER_TYPES = {"application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip",
                    "application/vnd.oci.image.layer.v1.tar+zstd",
                    "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "application/vnd.docker.image.rootfs.diff.tar"}


@dataclass
class OciSurvey:
    """What one tag list of `REPO/<recipe>` shows: versions (N -> its tag) and claims
    (N -> the tokens of the jobs that claimed it)."""

    recipe: str
    versions: dict[int, str] = field(default_factory=dict)
    claims: dict[int, set[str]] = field(default_factory=dict)
    # repository -> {tag: the digest it names}, read by pruning (OciDestination._tag_digests)
    tag_digests: dict[str, dict[str, str]] = field(default_factory=dict)

    def used(self) -> set[int]:
        return set(self.versions) | set(self.claims)

    def complete_numbers(self) -> list[int]:
        """A version tag is a whole version: the registry takes a manifest only when every
        blob it names is there (distribution registry/storage/ocimanifesthandler.go verifyManifest)."""
        return sorted(self.versions)


@dataclass(frozen=True)
class OciVersion:
    """A version's manifest as read from the registry: its digest, its JSON, and tpubuild's
    facts of it when it is tpubuild's (`format`, the recipe and number its annotations say)."""

    digest: str
    document: dict[str, Any]
    format: str | None

    @property
    def annotations(self) -> dict[str, str]:
        found = self.document.get("annotations")
        return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}

    @property
    def layers(self) -> list[dict[str, Any]]:
        layers = self.document.get("layers")
        return [d for d in layers if isinstance(d, dict)] if isinstance(layers, list) else []

    def layer_with(self, key: str, value: str) -> dict[str, Any] | None:
        found = [d for d in self.layers if isinstance(d.get("annotations"), dict) and d["annotations"].get(key) == value]
        return found[0] if len(found) == 1 else None


def descriptor_problem(descriptor: Any) -> str | None:
    """Why `descriptor` is not a descriptor tpubuild reads (a sha256 digest, a size)."""
    from tpubuild.transport import BLOB_DIGEST

    if not isinstance(descriptor, dict):
        return "a descriptor is not an object"
    digest, size = descriptor.get("digest"), descriptor.get("size")
    if not isinstance(digest, str) or not BLOB_DIGEST.fullmatch(digest):
        return f"digest {str(digest)[:80]!r} is not sha256:<64 hex digits>"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{digest}: its size is not a number of bytes"
    if not isinstance(descriptor.get("mediaType"), str):
        return f"{digest}: no media type"
    return None


class OciDestination:
    """One oci:// destination. `settings`: the recipe's `oci:` (format, base_image,
    insecure). Registry errors become DestinationErrors naming the URL; warnings (what the
    registry holds that tpubuild leaves alone) go to `say`, each once."""

    def __init__(self, url: str, timeouts: Any = None, settings: dict[str, Any] | None = None,
                 say: Callable[[str], None] | None = None, registry: Any = None):
        from tpubuild.config.remote_url import oci_address

        self.url = url.rstrip("/")
        self.address = oci_address(self.url)
        self.timeouts = timeouts
        self.settings = dict(settings or {})
        self.format = self.settings.get("format", "modelpack")
        assert self.format in FORMATS, self.format
        self.say = say or (lambda line: None)
        self._said: set[str] = set()
        self._registry = registry
        self._deletes_refused = False

    # --- the registry -----------------------------------------------------------------
    @property
    def registry(self) -> Any:
        if self._registry is None:
            from tpubuild.transport import Registry

            self._registry = Registry(self.address, self.timeouts, self.settings.get("insecure"))
        return self._registry

    def call(self, what: str, fn: Callable[..., Any]) -> Any:  # a lambda binding its loop values as defaults
        """`fn()` with the registry's errors said as one line naming the URL (the
        DestinationError's `cause` is the registry's error)."""
        from tpubuild.transport import RegistryAuthError, RegistryError

        try:
            return fn()
        except (RegistryError, RegistryAuthError) as exc:  # credentials refused: not asked again either
            error = DestinationError(f"publish_to {self.url}: {exc}", unreachable=True)
            error.cause = exc
            raise error from None
        except (TpubuildError, FileNotFoundError):
            raise
        except OSError as exc:
            raise DestinationError(f"publish_to {self.url}: {what}: {exc.strerror or exc}", unreachable=True) \
                from None

    def warn(self, line: str) -> None:
        line = f"warning: publish_to {self.url}: {line}"
        if line not in self._said:
            self._said.add(line)
            self.say(line)

    def repository(self, recipe: str, target: str | None = None) -> str:
        return "/".join([self.address.repository, recipe, *([target] if target else [])])

    def base_path(self, recipe: str) -> str:
        """What a server is pointed at for a recipe: its repository."""
        return f"{self.url}/{recipe}"

    def version_url(self, recipe: str, number: int, target: str | None = None) -> str:
        return f"oci://{self.address.host}/{self.repository(recipe, target)}:{number}"

    # --- reading ----------------------------------------------------------------------
    def survey(self, recipe: str) -> OciSurvey:
        """One tag list of `REPO/<recipe>`: decimal tags within int64 (fs/names.py
        version_number, as for buckets) are versions, `tpubuild-claim-<N>-<token>` claims;
        every other tag is someone's and is left alone. A number more than MAX_GAP above the
        one below it is no number tpubuild took: it and any above are ignored, said once."""
        found = OciSurvey(recipe)
        repository = self.repository(recipe)
        for tag in self.call(f"cannot list {repository}", lambda: self.registry.tags(repository)):
            number = version_number(tag)
            if number is not None:
                found.versions[number] = tag
                continue
            claim = CLAIM_TAG.fullmatch(tag)
            if claim and (claimed := version_number(claim.group(1))) is not None:
                found.claims.setdefault(claimed, set()).add(claim.group(2))
        previous = 0
        for number in sorted(found.used()):
            if number - previous > MAX_GAP:
                self.warn(f"{repository}: {number} is more than {MAX_GAP} above the highest number before it "
                          f"({previous}): not a number tpubuild took; it and any above it are ignored")
                found.versions = {n: t for n, t in found.versions.items() if n <= previous}
                found.claims = {n: c for n, c in found.claims.items() if n <= previous}
                break
            previous = number
        return found

    def version(self, recipe: str, number: int, target: str | None = None) -> OciVersion | None:
        """Version `number`'s manifest (None when its tag is gone); `format` None when it
        is not a manifest tpubuild writes for that recipe and number."""
        repository = self.repository(recipe, target)
        got = self.call(f"cannot read {repository}:{number}",
                        lambda: self.registry.manifest(repository, str(number)))
        if got is None:
            return None
        try:
            document = json.loads(got.data)
        except ValueError:
            return OciVersion(got.digest, {}, None)
        if not isinstance(document, dict):
            return OciVersion(got.digest, {}, None)
        version = OciVersion(got.digest, document, None)
        notes = version.annotations
        if document.get("mediaType", got.media_type) != OCI_MANIFEST or notes.get(RECIPE) != recipe \
                or notes.get(VERSION) != str(number) or any(descriptor_problem(d) for d in version.layers) \
                or descriptor_problem(document.get("config")):
            return version
        if document.get("artifactType") == MODEL_ARTIFACT:
            kind = "modelpack"
        elif document["config"].get("mediaType") == OCI_IMAGE_CONFIG:
            kind = "modelcar"
        else:
            return version
        return OciVersion(got.digest, document, kind)

    def description(self, recipe: str, version: OciVersion, number: int, target: str | None = None
                    ) -> dict[str, Any] | None:
        """The tpubuild-manifest.json of a version of tpubuild's, read and checked against
        the digest its manifest's annotation names; None when it cannot be."""
        from tpubuild.publish.targets import MANIFEST
        from tpubuild.publish.version_check import DESCRIPTION_LIMIT
        from tpubuild.transport import sha256_digest

        want = version.annotations.get(MANIFEST_DIGEST)
        repository = self.repository(recipe, target)
        if version.format == "modelpack":
            layer = version.layer_with(FILEPATH, MANIFEST)
            if layer is None or layer["digest"] != want or layer["size"] > DESCRIPTION_LIMIT:
                return None
            data = self._blob(repository, layer, DESCRIPTION_LIMIT)
        elif version.format == "modelcar":
            layer = version.layer_with(LAYER_ROLE, "description")
            if layer is None:
                return None
            data = self._member(repository, layer, f"models/{number}/{MANIFEST}", DESCRIPTION_LIMIT)
            if data is None or sha256_digest(data) != want:
                return None
        else:
            return None
        try:
            parsed = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def _blob(self, repository: str, descriptor: dict[str, Any], limit: int) -> bytes | None:
        """A small blob whole, checked; None when it is over `limit` or not its descriptor's."""
        if descriptor["size"] > limit:
            return None
        return self._unless_mismatch(f"cannot read {repository}@{descriptor['digest']}", lambda: b"".join(
            self.registry.blob_pieces(repository, descriptor["digest"], descriptor["size"])))

    def _member(self, repository: str, descriptor: dict[str, Any], name: str, limit: int) -> bytes | None:
        """One regular file of a tar layer, streamed (never the whole layer in memory);
        None when it is not there or the layer is not its descriptor's."""
        import tarfile

        from tpubuild.publish.oci_format import PiecesReader

        def find() -> bytes | None:
            reader = PiecesReader(self.registry.blob_pieces(repository, descriptor["digest"], descriptor["size"]))
            try:
                with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                    for member in tar:
                        if member.name == name and member.isreg() and member.size <= limit:
                            handle = tar.extractfile(member)
                            return handle.read() if handle is not None else None
            except (tarfile.TarError, OSError):
                return None
            return None

        return self._unless_mismatch(f"cannot read {repository}@{descriptor['digest']}", find)

    def _unless_mismatch(self, what: str, fn: Callable[[], bytes | None]) -> bytes | None:
        from tpubuild.transport import BlobMismatch

        try:
            return self.call(what, fn)
        except DestinationError as exc:
            if isinstance(getattr(exc, "cause", None), BlobMismatch):
                return None
            raise

    # --- numbers ----------------------------------------------------------------------
    def claim(self, survey: OciSurvey) -> tuple[int, OciSurvey]:
        """A number no other job has or will have (the protocol in this module's
        docstring), and the tag list taken after it was claimed."""
        repository = self.repository(survey.recipe)
        token = secrets.token_hex(12)
        job = whoami()
        self.call(f"cannot push to {repository}",
                  lambda: self.registry.push_blob(repository, EMPTY_DIGEST, len(EMPTY), EMPTY))
        for attempt in range(MAX_CLAIM_TRIES):
            number = max(survey.used(), default=0) + 1
            if number > INT64_MAX:
                raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number left within int64")
            tag = claim_tag(number, token)
            self.call(f"cannot claim {repository}:{number}",
                      lambda t=tag, n=number: self.registry.put_manifest(
                          repository, t, claim_manifest(n, token, job), OCI_MANIFEST))
            survey = self.survey(survey.recipe)
            claims = survey.claims.get(number, set())
            if token not in claims:
                raise DestinationError(
                    f"publish_to {self.url}: {repository}: the tag list does not show the claim {tag} the registry "
                    "just took: its tag list is not read-after-write consistent (a cache or a replica in front "
                    "of it?), and numbers cannot be claimed safely there (docs/publish-to-oci.md)")
            if claims == {token} and number not in survey.versions:
                return number, survey
            time.sleep(random.uniform(0.0, min(2.0, 0.05 * 2 ** min(attempt, 6))))  # a rival: apart again
        raise DestinationError(f"publish_to {self.url}: {survey.recipe}: no version number free after "
                               f"{MAX_CLAIM_TRIES} tries (other jobs claimed them first)")

    # --- writing ----------------------------------------------------------------------
    def push(self, recipe: str, number: int, target: str | None, config: Blob, layers: list[Blob],
             manifest: bytes, base: BaseImage | None = None) -> str:
        """Version `number` (of `target`, or the recipe's main one): its blobs, each sent
        unless the repository has it, the base image's mounted, then its config, then its
        manifest under the tag `number`: unless that tag names it already (a retry: nothing
        to do), or names something else, which is never overwritten. Returns the digest."""
        from tpubuild.transport import sha256_digest

        repository = self.repository(recipe, target)
        if base is not None:
            for layer in base.layers:
                if not self.call(f"cannot mount {layer['digest']}",
                                 lambda d=layer["digest"]: self.registry.mount_blob(repository, d, base.repository)):
                    raise DestinationError(f"publish_to {self.url}: the registry would not mount the base image's "
                                           f"layer {layer['digest']} from {base.repository} into {repository}")
        for blob in [*layers, config]:
            source = blob.data if blob.data is not None else blob.open
            self.call(f"cannot push {blob.digest} to {repository}",
                      lambda b=blob, s=source: self.registry.push_blob(repository, b.digest, b.size, s))
        digest = sha256_digest(manifest)
        there = self.call(f"cannot read {repository}:{number}", lambda: self.registry.manifest(repository, str(number)))
        if there is not None and there.digest != digest:
            raise DestinationError(f"publish_to {self.url}: {repository}:{number} exists and names other bytes "
                                   f"({there.digest}): pushed by a writer that does not claim numbers; not "
                                   "overwritten")
        if there is None:
            self.call(f"cannot push {repository}:{number}",
                      lambda: self.registry.put_manifest(repository, str(number), manifest, OCI_MANIFEST))
        back = self.call(f"cannot read {repository}:{number}", lambda: self.registry.manifest(repository, str(number)))
        if back is None or back.digest != digest:
            raise DestinationError(f"publish_to {self.url}: {repository}:{number} does not read back as pushed "
                                   f"({back.digest if back else 'gone'}, not {digest})")
        return digest

    def base_image(self) -> BaseImage | None:
        """The modelcar's base (`base_image:`), read from the registry: one image manifest
        and its config (an index, naming several platforms, is refused: give a digest)."""
        from tpubuild.config.remote_url import oci_base_reference

        written = self.settings.get("base_image")
        if self.format != "modelcar" or not written:
            return None
        parsed = oci_base_reference(written)
        if parsed is None:  # validate refused it already
            raise DestinationError(f"publish_to {self.url}: oci.base_image {written!r} is not REPO:TAG")
        repository, reference = parsed
        got = self.call(f"cannot read the base image {written}",
                        lambda: self.registry.manifest(repository, reference))
        if got is None:
            raise DestinationError(f"publish_to {self.url}: oci.base_image {written}: no such image in "
                                   f"{self.address.host}")
        try:
            document = json.loads(got.data)
            layers, config = document["layers"], document["config"]
        except (ValueError, KeyError, TypeError):
            kind = got.media_type or "not an image manifest"
            raise DestinationError(f"publish_to {self.url}: oci.base_image {written} is an index or a list of "
                                   f"platforms ({kind}), not one image: give REPO@sha256:<its platform's "
                                   "manifest>") from None
        problems = [descriptor_problem(d) for d in [config, *layers]]
        if any(problems) or any(d["mediaType"] not in BASE_LAYER_TYPES for d in layers):
            raise DestinationError(f"publish_to {self.url}: oci.base_image {written}: its layers are not image "
                                   "layers tpubuild can put a model on")
        data = self._blob(repository, config, DOCUMENT_LIMIT)
        try:
            parsed_config = json.loads(data) if data is not None else None
        except ValueError:
            parsed_config = None
        if not isinstance(parsed_config, dict):
            raise DestinationError(f"publish_to {self.url}: oci.base_image {written}: its config is unreadable")
        keep = ("digest", "size", "mediaType")
        return BaseImage(repository, [{k: d[k] for k in keep} for d in layers], parsed_config)

    # --- pruning and cleaning -----------------------------------------------------------
    def mend(self, survey: OciSurvey, say: Callable[[str], None]) -> list[str]:
        """What killed pushes left that tpubuild removes (`clean --remote`): the claims of
        numbers that never got a version, below the newest version and older than
        UNCLAIMED_AGE by their own `created` (a job's claim lives seconds before its push;
        no job can still be pushing one a day old, and no later claim can take its number,
        which is below a version's). A killed push's blobs are the registry's garbage
        collection's (it removes those no manifest names); it never leaves a tag N."""
        numbers = survey.complete_numbers()
        if not numbers or self._deletes_refused:
            return []
        done = []
        for number in sorted(n for n in survey.claims if n < numbers[-1] and n not in survey.versions):
            removed = self._remove_claims(survey, number, older_than=UNCLAIMED_AGE)
            if removed:
                done.append(f"removed the claim of {self.version_url(survey.recipe, number)} (a publish that "
                            f"stopped before its push; number {number} stays unused)")
        return done

    def _claim_manifest(self, repository: str, number: int, token: str) -> tuple[str, float] | None:
        """(digest, created) of the claim tag of `number` and `token` when it names a claim
        document of that number and token (a co-writer may point it elsewhere)."""
        tag = claim_tag(number, token)
        got = self.call(f"cannot read {repository}:{tag}", lambda: self.registry.manifest(repository, tag))
        if got is None:
            return None
        try:
            document = json.loads(got.data)
            notes = document["annotations"]
            job = json.loads(notes[CLAIM_JOB])
            created = calendar.timegm(time.strptime(notes[CREATED], "%Y-%m-%dT%H:%M:%SZ"))
        except (ValueError, KeyError, TypeError):
            return None
        if document.get("artifactType") != CLAIM_ARTIFACT or notes.get(CLAIM_NUMBER) != str(number) \
                or not isinstance(job, dict) or job.get("token") != token:
            return None
        return got.digest, float(created)

    def _remove_claims(self, survey: OciSurvey, number: int, older_than: float = 0.0) -> bool:
        """Delete the claims of `number` (claim documents of it whose `created` is more than
        `older_than` seconds ago), each by its digest, unless another tag names it."""
        repository = self.repository(survey.recipe)
        removed = False
        for token in sorted(survey.claims.get(number, ())):
            found = self._claim_manifest(repository, number, token)
            if found is None or time.time() - found[1] <= older_than:
                continue
            if self._delete(survey, repository, found[0], claim_tag(number, token)):
                removed = True
        return removed

    def _tag_digests(self, survey: OciSurvey, repository: str) -> dict[str, str]:
        """Every tag of `repository` -> the digest of the manifest it names (claims of
        other numbers left out: tpubuild's own, one document each), read once per survey."""
        cache = survey.tag_digests.get(repository)
        if cache is None:
            cache = {}
            for tag in self.call(f"cannot list {repository}", lambda: self.registry.tags(repository)):
                if CLAIM_TAG.fullmatch(tag):
                    continue
                got = self.call(f"cannot read {repository}:{tag}", lambda t=tag: self.registry.manifest(repository, t))
                if got is not None:
                    cache[tag] = got.digest
            survey.tag_digests[repository] = cache
        return cache

    def _delete(self, survey: OciSurvey, repository: str, digest: str, tag: str) -> bool:
        """Delete the manifest `digest` that `tag` names, unless another tag names it too: a
        delete by digest removes every tag naming it (distribution registry/handlers/
        manifests.go DeleteManifest: tagService.Lookup, then Untag each), and another tag
        (a co-writer's `stable`, `latest`) is not tpubuild's to remove. False when left."""
        others = sorted(t for t, d in self._tag_digests(survey, repository).items() if d == digest and t != tag)
        if others:
            self.warn(f"{self.address.host}/{repository}:{tag} is left: the tag{'s' if len(others) > 1 else ''} "
                      f"{', '.join(others[:5])} also name{'' if len(others) > 1 else 's'} its manifest, and deleting "
                      "it would remove them")
            return False
        self.call(f"cannot delete {repository}:{tag}", lambda: self.registry.delete_manifest(repository, digest))
        return True

    def published_reason(self, survey: OciSurvey, number: int) -> tuple[str | None, list[str]]:
        """(None when `<recipe>:<N>` is a version tpubuild published: a manifest of its
        formats whose annotations name the recipe and N, whose tpubuild-manifest.json reads
        back; else why not; and the targets its manifest lists)."""
        version = self.version(survey.recipe, number)
        if version is None:
            return "its tag is gone", []
        if version.format is None:
            return "it is not a manifest tpubuild pushed for it", []
        described = self.description(survey.recipe, version, number)
        if described is None or described.get("recipe") != survey.recipe:
            return "its tpubuild-manifest.json does not read back as its manifest says", []
        listed = described.get("targets")
        targets: dict[str, Any] = listed if isinstance(listed, dict) else {}
        from tpubuild.config.remote_url import OCI_COMPONENT

        return None, sorted(t for t in targets if isinstance(t, str) and OCI_COMPONENT.fullmatch(t))

    def newest_published(self, survey: OciSurvey) -> int | None:
        for number in reversed(survey.complete_numbers()):
            if self.published_reason(survey, number)[0] is None:
                return number
        return None

    def remove_version(self, survey: OciSurvey, number: int, targets: list[str]) -> bool:
        """Each target's tag N, then the recipe's: its manifest deleted by digest (which
        removes the tag; the blobs stay until the registry's garbage collection), then the
        claims of N. False when a manifest was left (another tag names it)."""
        for target in [*targets, None]:
            version = self.version(survey.recipe, number, target)
            if version is None:
                continue
            if not self._delete(survey, self.repository(survey.recipe, target), version.digest, str(number)):
                return False
        self._remove_claims(survey, number)
        return True

    def prune(self, survey: OciSurvey, keep: int | None, pinned: set[int], say: Callable[[str], None],
              everything: bool = False) -> list[int]:
        """Delete the versions tpubuild published but the newest `keep` (all but the newest
        with `everything`: `clean --remote`), never the newest, the newest of tpubuild's,
        nor a pinned one; a version that is not tpubuild's, or whose manifest another tag
        names, is left and said. The claims of a deleted version go with it; the newest's
        stay, so its number is never taken again. A registry that does not delete is said
        once; nothing fails."""
        from tpubuild.transport import DeletesRefused

        numbers = survey.complete_numbers()
        if not numbers or (keep is None and not everything) or self._deletes_refused:
            return []
        newest = numbers[-1:] if everything else numbers[-(keep or 1):]
        kept = set(newest) | set(pinned)
        ours = self.newest_published(survey)
        if ours is not None:
            kept.add(ours)
        removed = []
        for number in numbers:
            if number in kept:
                continue
            why, targets = self.published_reason(survey, number)
            if why is not None:
                say(f"warning: {self.version_url(survey.recipe, number)}: {why}; left in place")
                continue
            try:
                if not self.remove_version(survey, number, targets):
                    continue
            except DestinationError as exc:
                if not isinstance(exc.cause, DeletesRefused):
                    raise
                self._deletes_refused = True
                self.warn(f"the registry does not delete ({str(exc.cause)}): old versions are left "
                          "(distribution: storage.delete.enabled)")
                break
            removed.append(number)
        return removed
