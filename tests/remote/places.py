"""Publish destinations as a test reads them on its own, past tpubuild: moto's S3 server
(tests/remote/conftest.py `s3`) or a directory standing for a mount."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.remote.conftest import BUCKET

MANIFEST = "tpubuild-manifest.json"


@dataclass
class Place:
    """A publish destination the test reads on its own: `listing()` relative path -> size."""

    url: str
    env: dict[str, str]
    listing: Callable[[], dict[str, int]]
    read: Callable[[str], bytes]

    def versions(self, recipe: str = "toy") -> list[int]:
        """The numbers TF Serving would load: `<N>/saved_model.pb` listed."""
        return sorted(int(rel.split("/")[1]) for rel in self.listing()
                      if rel.startswith(f"{recipe}/") and rel.count("/") == 2 and rel.endswith("/saved_model.pb"))

    def manifest(self, number: int, recipe: str = "toy") -> dict:
        return json.loads(self.read(f"{recipe}/{number}/{MANIFEST}"))

    def leftovers(self) -> list[str]:
        """Objects of a publish that did not finish: staging or seals."""
        return [rel for rel in self.listing() if "/.tpubuild/staging/" in rel or "/.tpubuild/sealed/" in rel]

    def partial(self) -> list[str]:
        """Numbered directories TF Serving could see without their saved_model.pb."""
        listed = self.listing()
        return sorted({rel.rsplit("/", rel.count("/") - 1)[0] for rel in listed
                       if rel.split("/")[1].isdigit()
                       and f"{'/'.join(rel.split('/')[:2])}/saved_model.pb" not in listed})


def s3_place(s3, prefix: str) -> Place:
    def listing() -> dict[str, int]:
        found = {}
        for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                found[item["Key"][len(prefix) + 1:]] = item["Size"]
        return found

    def read(rel: str) -> bytes:
        return s3.client.get_object(Bucket=BUCKET, Key=f"{prefix}/{rel}")["Body"].read()

    return Place(f"s3://{BUCKET}/{prefix}", dict(s3.env), listing, read)


def file_place(root: Path) -> Place:
    root.mkdir(parents=True)

    def listing() -> dict[str, int]:
        found = {}
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                try:  # a writer may rename or remove it meanwhile (the race test's jobs)
                    found[Path(path).relative_to(root).as_posix()] = os.lstat(path).st_size
                except FileNotFoundError:
                    continue
        return found

    return Place(f"file://{root}", {}, listing, lambda rel: (root / rel).read_bytes())
