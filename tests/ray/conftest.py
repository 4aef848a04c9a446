"""Ray executor tests: one real local Ray cluster per session (`ray start --head` in a
process group of its own, on free ports so it never meets another cluster on this
machine), real builds through it with a `file://` remote cache."""

from __future__ import annotations

import pytest

from tests.engine.conftest import tiny_saved_model  # noqa: F401  (the session's tiny SavedModel)
from tests.ray.cluster import local_cluster


@pytest.fixture(scope="session")
def ray_address() -> str:
    """The address of a 2-CPU local Ray cluster with a custom resource, stopped at the end."""
    with local_cluster(num_cpus=2, resources={"tpubuild_test_accelerator": 2}) as address:
        yield address
