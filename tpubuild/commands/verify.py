from __future__ import annotations

import os
from pathlib import Path

import click

from tpubuild.fs import version_number
from tpubuild.provenance.statement import PROVENANCE, SIGNATURE
from tpubuild.publish import MANIFEST


@click.command(
    "verify",
    short_help="Check a published version against its manifest and its signature.",
    epilog="\b\nExample:\n  tpubuild verify out/toy/1",
)
@click.argument("path")
@click.option("--key", type=click.Path(path_type=Path, dir_okay=False),
              help="The signer's public key (PEM): the version must be signed with its private key.")
@click.option("--certificate-chain", "chain", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
              help="A CA certificate (PEM; repeat for a chain): the version must be signed with a certificate it issued.")
@click.option("--insecure", is_flag=True,
              help="An oci:// PATH's registry is spoken to in plain HTTP (without it: HTTPS, but to 127.0.0.1, ::1 "
                   "and localhost).")
def command(path: str, key: Path | None, chain: tuple[Path, ...], insecure: bool = False) -> int:
    """Every file of the version PATH must be the one its tpubuild-manifest.json lists (no
    file changed, missing or added); with --key, its model.sig (OpenSSF model-signing
    format) must verify with KEY over exactly these files. A version whose directory is
    named `<recipe>/<N>` (or `<recipe>/<target>/<N>`) must also be that version: its
    manifest and its provenance statement name that recipe, target and number (a signed
    version copied under another number or recipe fails). Says each difference on a
    line; exit 1 when there is one, exit 2 when PATH is not a version (a recipe's
    directory, nothing there). TensorFlow is not imported.

    In a workspace that signs what it publishes (`signing: {key: ...}` in tpubuild.yaml),
    give the public half of that key: `tpubuild verify out/toy/1 --key signing.pub.pem`.

    PATH may be a version on a publish destination, `s3://bucket/models/toy/3` (gs://,
    file://): the objects its manifest lists are downloaded into a temporary directory
    (credentials from the backend's environment, as for `publish_to:`), each under a clean
    relative name and no larger than listed, checked there the same way, and deleted; an
    object the manifest does not list, or whose name is not a clean relative path, is a
    difference, never downloaded.

    PATH may be a version in an OCI registry, `oci://registry.example/models/toy:3` (a
    target's: `.../toy/litert:3`): every blob is pulled into a temporary directory and
    checked against its descriptor's digest and size, each ModelPack layer written under
    its clean `org.cncf.model.filepath` (a modelcar's tar members under `models/<N>/`),
    then checked the same way (credentials from docker's config, as for `publish_to:`).
    """
    from tpubuild.errors import UsageError

    if key is not None and chain:
        raise UsageError("give --key or --certificate-chain, not both")
    for given in [*([key] if key else []), *chain]:
        if not given.is_file():
            raise UsageError(f"{given}: no such file")
    if path.startswith("oci://"):
        return _verify_oci(path, key, chain, insecure)
    if "://" in path:
        return _verify_url(path.rstrip("/"), key, chain)
    directory = Path(path)
    if not directory.is_dir():
        raise UsageError(f"{path}: not a directory ({GIVE})")
    if not os.path.lexists(directory / MANIFEST) and version_number(directory.resolve().name) is None:
        # A recipe's directory, the output directory: not a version (exit 2, as any path a verb does not take).
        raise UsageError(f"{path}: not a version ({GIVE})")
    components = list(Path(os.path.abspath(path)).parts)
    return _verify(directory, path, key, chain, components if version_number(components[-1]) is not None else None)


GIVE = "give a published version, e.g. out/<recipe>/<N>"


def _verify(directory: Path, shown: str, key: Path | None, chain: tuple[Path, ...], components: list[str] | None,
            found: list[str] | None = None, withheld: frozenset[str] | set[str] = frozenset()) -> int:
    """Check `directory` (shown as `shown`): its files against its manifest, then, when
    `components` (the path's, ending `<recipe>/<N>`) are given, that it is the version they
    name; then its signature, unless a file was refused before hashing (the signature
    check would hash it). `found`: problems already seen (verify URL's)."""
    from tpubuild.provenance.signature import check_signature
    from tpubuild.publish import check_version, identity_problems, read_description

    checked = check_version(directory, withheld)
    problems = [*(found or []), *checked.problems]
    refused = checked.refused or bool(withheld)
    if checked.manifest is not None and components is not None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            statement = read_description(fd, PROVENANCE) if os.path.lexists(directory / PROVENANCE) else None
        finally:
            os.close(fd)
        if statement is None and os.path.lexists(directory / PROVENANCE):
            problems.append(f"{PROVENANCE}: unreadable")
        problems += identity_problems(components, checked.manifest, statement)
    if key is not None or chain:
        if refused:
            problems.append(f"{SIGNATURE}: not checked (a file above is not what its manifest lists, and is not read)")
        else:
            problems += check_signature(directory, key, list(chain))
    for line in problems:
        click.echo(f"{shown}: {line}", err=True)
    if problems:
        return 1
    signer = f" and its signature by {key}" if key else (" and its certificate signature" if chain else "")
    click.echo(f"{shown}: every file matches its manifest{signer}")
    return 0


def _verify_url(url: str, key: Path | None, chain: tuple[Path, ...]) -> int:
    """A version on a destination, downloaded into a temporary directory of verify's own
    (publish/verify_remote.py: clean names only, each no larger than listed), then checked."""
    import tempfile

    from tpubuild.config.remote_url import url_problem
    from tpubuild.errors import UsageError
    from tpubuild.publish import fetch_version

    problem = url_problem(url)
    if problem:
        raise UsageError(f"{url}: {problem}")
    with tempfile.TemporaryDirectory(prefix="tpubuild-verify-") as tmp:
        directory = Path(tmp) / "version"
        found, withheld = fetch_version(url, directory)
        return _verify(directory, url, key, chain, url.split("/"), found, withheld)


def _verify_oci(url: str, key: Path | None, chain: tuple[Path, ...], insecure: bool) -> int:
    """A version in a registry, pulled into a temporary directory of verify's own
    (publish/oci_fetch.py: every blob checked, clean names only), then checked."""
    import tempfile

    from tpubuild.publish import fetch_oci_version, oci_version_components

    components = oci_version_components(url)
    with tempfile.TemporaryDirectory(prefix="tpubuild-verify-") as tmp:
        directory = Path(tmp) / "version"
        found, withheld = fetch_oci_version(url, directory, insecure=True if insecure else None)
        return _verify(directory, url, key, chain, components, found, withheld)
