"""Real servers the tests talk to, each started as its own process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from fakes.ports import free_port


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError as exc:
            if hasattr(exc, "code"):
                return  # any HTTP answer means the server is up
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from exc
            time.sleep(0.1)


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """moto in server mode (the AWS wire protocol over HTTP) in a subprocess; yields its endpoint URL."""
    port = free_port()
    log = open(log_dir / f"moto-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint + "/moto-api/")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # slow to stop on a loaded machine: stopped all the same, not a failure
            proc.kill()
            proc.wait()
        log.close()


AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never reach a real metadata service for credentials.
    "AWS_EC2_METADATA_DISABLED": "true",
}


def reset_moto(endpoint: str) -> None:
    """Empty moto's state between tests. No tight timeout: on a busy machine the reset of a large state can take a
    while, and a test must not fail for that (the suite's own timeout still ends a moto that hangs)."""
    request = urllib.request.Request(endpoint + "/moto-api/reset", method="POST")
    urllib.request.urlopen(request, timeout=300).close()


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_TEST_ENV)
    env.update(extra)
    return env
