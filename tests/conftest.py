"""Shared fixtures: real servers (moto in server mode), AWS test credentials, a clean moto per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import AWS_TEST_ENV, moto_server, reset_moto


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AWS variables pointing every SDK client at a freshly reset moto server; yields the endpoint."""
    reset_moto(moto_endpoint)
    for name, value in AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    yield moto_endpoint


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path
