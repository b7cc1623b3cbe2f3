"""The Valkey cluster fixture (:mod:`fakes.valkey_cluster`): one per test module, emptied before each test.

Import it explicitly (``from tests.cluster_fixtures import fixture_valkey_cluster``); it is registered as
``valkey_cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.valkey_cluster import ValkeyCluster

__all__ = ["fixture_valkey_cluster"]


@pytest.fixture(scope="module", name="valkey_cluster_server")
def fixture_valkey_cluster_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    cluster = ValkeyCluster(tmp_path_factory.mktemp("valkey-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(name="valkey_cluster")
def fixture_valkey_cluster(valkey_cluster_server: ValkeyCluster) -> ValkeyCluster:
    """Three primaries and three replicas, every one up and no key in any (a test may kill and promote nodes: a
    cluster that lost one is whole again, with a new replica, for the next test)."""
    valkey_cluster_server.wait_ok()
    valkey_cluster_server.flush()
    return valkey_cluster_server
