"""moto in server mode for the bench scripts (a process of its own, so the client's CPU figures are its own).

Bench scripts do not import ``tests``; this is the little of ``tests.servers`` they need.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never reach a real metadata service for credentials
}


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """Start ``python -m moto.server`` on a free loopback port; yields its endpoint URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with open(log_dir / f"moto-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
                    break
                except OSError as exc:
                    if hasattr(exc, "code"):
                        break  # any HTTP answer: it is up
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{endpoint} did not come up") from exc
                    time.sleep(0.1)
            yield endpoint
        finally:
            proc.terminate()
            proc.wait(10)


def reset_moto(endpoint: str) -> None:
    """Forget every object (moto keeps them in memory)."""
    urllib.request.urlopen(urllib.request.Request(endpoint + "/moto-api/reset", method="POST"), timeout=10).close()
