"""Versions published where servers read them (`publish_to:` in tpubuild.yaml, or a
recipe's own): any fsspec URL the remote extra's backends open (s3://, gs://, file://
for a shared mount), beside the local `out/`. docs/publish-to-object-storage.md says
what a server polling the destination can observe and when.

Layout under `<url>/<recipe>/`, TF Serving's base path of the recipe:
- `<N>/`, `<target>/<N>/`: the versions, as in the local `out/<recipe>/`.
- `.tpubuild/claims/<N>`: one object per number ever taken, written create-only (S3
  `If-None-Match: *`, GCS `ifGenerationMatch=0`, O_EXCL on a mount: transport/backends.py
  `create`): the store, not a machine, hands out numbers, and a number claimed by a job
  that was then killed is never taken again (claims are never deleted, not by pruning nor
  by `clean`).
- `.tpubuild/staging/<N>/version/`, `.tpubuild/staging/<N>/targets/<target>/`: the
  version being uploaded, then checked object by object (size, then BLAKE3 against the
  manifest) before anything of it appears under `<N>/`.
- `.tpubuild/sealed/<N>`: written create-only once every staged object checked; it lists
  what to copy where. From then on anyone may finish the version (copies of checked
  bytes, the same whoever makes them): the next publish completes a sealed version a
  killed job left, and removes an unsealed staging whose job is gone.

TF Serving sees none of `.tpubuild/`: its FileSystemStoragePathSource aspires only the
children of the base path whose name parses as an int64
(tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc,
ParseVersionNumber/IndexChildrenByVersion; on GCS and S3 it takes each listed name's first
path component). On an object store a version appears object by object (there is no
rename): `saved_model.pb` last, each other object checked present and whole before it,
because the SavedModel loader treats a directory without `saved_model.pb` as no model
(tensorflow/cc/saved_model/loader.cc MaybeSavedModelDirectory, a NOT_FOUND TF Serving
retries: loader_harness.cc, `max_num_load_retries`) but one without
`variables/variables.index` as a model without variables ("no checkpoints were
restored": served with uninitialized variables). On a mount the staged directory is
renamed into place: every file appears at one instant.

A destination is written by many (every CI job, a group mount's users): every name, number
and document read from it is data, checked before it becomes a path, a number or a verdict
(fs/names.py; on a mount no link is followed below the root: transport/mount.py), and a version
counts as a recipe's model only by its bytes. What is not what tpubuild writes is left alone
with one warning line. docs/publish-to-object-storage.md "Trust model".
"""

from __future__ import annotations

from tpubuild.publish.dest_mend import DestinationMending

__all__ = ["Destination"]


class Destination(DestinationMending):
    """One publish destination, `url` (its backend rooted at the URL itself). Every backend
    error but "absent" and "exists" becomes a DestinationError naming the URL. Its parts,
    one module each, joined as one class (mixins: all work on one backend, one survey and
    one set of warnings said once): its layout and base (publish/dest_state.py), reading
    (publish/dest_survey.py), claiming, staging, sealing and promoting
    (publish/dest_write.py), mending and pruning (publish/dest_mend.py); whose claim a
    number is: publish/dest_claims.py."""
