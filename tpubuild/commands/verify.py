from __future__ import annotations

from pathlib import Path

import click


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
def command(path: str, key: Path | None, chain: tuple[Path, ...]) -> int:
    """Every file of the version PATH must be the one its tpubuild-manifest.json lists (no
    file changed, missing or added); with --key, its model.sig (OpenSSF model-signing
    format) must verify with KEY over exactly these files. Says each difference on a
    line; exit 1 when there is one. TensorFlow is not imported.

    In a workspace that signs what it publishes (`signing: {key: ...}` in tpubuild.yaml),
    give the public half of that key: `tpubuild verify out/toy/1 --key signing.pub.pem`.

    PATH may be a version on a publish destination, `s3://bucket/models/toy/3` (gs://,
    file://): its objects are downloaded into a temporary directory (credentials from the
    backend's environment, as for `publish_to:`), checked there the same way, and deleted.
    """
    from tpubuild.errors import UsageError

    if key is not None and chain:
        raise UsageError("give --key or --certificate-chain, not both")
    for given in [*([key] if key else []), *chain]:
        if not given.is_file():
            raise UsageError(f"{given}: no such file")
    if "://" in path:
        return _verify_url(path.rstrip("/"), key, chain)
    if not Path(path).is_dir():
        raise UsageError(f"{path}: not a directory (give a published version, e.g. out/<recipe>/<N>)")
    return _verify(Path(path), path, key, chain)


def _verify(directory: Path, shown: str, key: Path | None, chain: tuple[Path, ...]) -> int:
    from tpubuild.provenance.signature import check_signature
    from tpubuild.publish import check_manifest

    problems = check_manifest(directory)
    if key is not None or chain:
        problems += check_signature(directory, key, list(chain))
    for line in problems:
        click.echo(f"{shown}: {line}", err=True)
    if problems:
        return 1
    signer = f" and its signature by {key}" if key else (" and its certificate signature" if chain else "")
    click.echo(f"{shown}: every file matches its manifest{signer}")
    return 0


def _verify_url(url: str, key: Path | None, chain: tuple[Path, ...]) -> int:
    """A version on a destination, downloaded (each object no larger than listed), then checked."""
    import tempfile

    from tpubuild.config.remote_url import url_problem
    from tpubuild.errors import UsageError
    from tpubuild.publish import download_version

    problem = url_problem(url)
    if problem:
        raise UsageError(f"{url}: {problem}")
    with tempfile.TemporaryDirectory(prefix="tpubuild-verify-") as tmp:
        # Its own name, as published: check_manifest reads the number from the directory's.
        directory = Path(tmp) / url.rsplit("/", 1)[-1]
        download_version(url, directory)
        return _verify(directory, url, key, chain)
