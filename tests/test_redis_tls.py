"""REDIS_URL as production gives it: ``rediss://`` (TLS, the certificate checked) with a user and password or an AUTH
token, against a TLS-only Valkey (tests/tls_valkey.py). A wrong password, an untrusted certificate or a plain
connection to the TLS port is one clear line that names the server and never the password."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bot.errors import ConfigError, StoreUnavailable
from bot.redis_server import RedisConfig, open_redis, plaintext_remote, redacted
from bot.settings import load_settings
from fakes.bot_harness import CHANNEL, running_bot
from tests.tls_valkey import TlsValkey, tls_valkey

PASSWORD = "p@ss:w/rd" + secrets.token_hex(8)  # characters a URL must escape, so the escaping is exercised too


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsValkey]:
    with tls_valkey(tmp_path_factory.mktemp("tls-valkey"), PASSWORD, username="finetune") as server:
        yield server


async def test_the_bot_runs_on_a_tls_valkey_with_a_user_and_password(tmp_path: Path, valkey: TlsValkey) -> None:
    before = valkey.terminator.handshakes
    async with running_bot(tmp_path / "state", redis_url=valkey.url()) as (service, _):
        assert "no jobs yet" in await service.bot.command("console:ana", CHANNEL, "list")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{service.port}/healthz") as health:
            assert health.status == 200
        admin = valkey.plain()
        clients = admin.client_list()
        groups = admin.xinfo_groups("finetune:events")
        admin.close()
    assert valkey.terminator.handshakes - before >= 2  # the store's and the bus's pools, both over TLS
    assert {client["user"] for client in clients} == {"finetune"}  # the default user is off: no one else gets in
    assert len(clients) >= 3  # the bot's pools and this admin connection
    assert groups  # the bus created its consumer group on the server behind TLS
    assert not (tmp_path / "state" / "redis").exists()  # no embedded server was started


async def test_an_auth_token_url_and_a_private_ca(tmp_path: Path) -> None:
    """ElastiCache's AUTH token form: ``rediss://:token@host:port/0``, here with the CA given in the URL."""
    token = secrets.token_urlsafe(32)
    with tls_valkey(tmp_path, token) as server:
        handle = await open_redis(
            RedisConfig(redis_url=f"rediss://:{token}@localhost:{server.port}/0?ssl_ca_certs={server.ca.ca_file}")
        )
        try:
            assert await handle.client.set("finetune:probe", "1")
            assert not handle.embedded
        finally:
            await handle.close()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"password": "not-the-password"}, "invalid username-password pair"),
        ({"trust": False}, "certificate verify failed"),
        ({"scheme": "redis"}, ""),  # plain Redis protocol to a TLS port: the server hangs up
    ],
    ids=["wrong-password", "untrusted-certificate", "no-tls"],
)
async def test_a_refusal_is_one_clear_error_without_the_password(
    valkey: TlsValkey, change: dict[str, object], reason: str
) -> None:
    url = valkey.url(**change)  # type: ignore[arg-type]
    handshakes_before = valkey.terminator.handshakes
    with pytest.raises(StoreUnavailable) as caught:
        await open_redis(RedisConfig(redis_url=url))
    message = str(caught.value)
    assert message.startswith(f"cannot use Redis at {redacted(url)}: ")
    assert f"localhost:{valkey.port}" in message and reason.lower() in message.lower()
    assert PASSWORD not in message and "not-the-password" not in message and ":***@" in message
    if change != {"password": "not-the-password"}:
        assert valkey.terminator.handshakes == handshakes_before  # refused at the TLS handshake, not after it


def test_redacted_hides_only_the_password() -> None:
    assert redacted("rediss://bot:s3cret@cache.example.com:6379/0?ssl_ca_certs=/ca.pem") == (
        "rediss://bot:***@cache.example.com:6379/0?ssl_ca_certs=/ca.pem"
    )
    assert redacted("rediss://:token@[::1]:6380") == "rediss://:***@[::1]:6380"
    assert redacted("redis://localhost:6379/0") == "redis://localhost:6379/0"


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    environ.update(FINETUNE_STATE_DIR=str(tmp_path / "state"), FINETUNE_HTTP_PORT="0", **env)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"], env=environ, capture_output=True, text=True, timeout=120
    )


def test_the_command_line_refuses_a_bad_url_and_a_wrong_password_in_one_line(tmp_path: Path, valkey: TlsValkey) -> None:
    bad = _serve(tmp_path, REDIS_URL="https://cache.example.com:6379")
    assert bad.returncode == 2, bad.stderr
    assert (
        bad.stderr.strip()
        == "finetune-bot: REDIS_URL='https://cache.example.com:6379': Value error, must start with redis://, rediss://"
        " (TLS) or unix://"
    )

    wrong = _serve(tmp_path, REDIS_URL=valkey.url(password="not-the-password"))
    assert wrong.returncode == 1, wrong.stderr  # not 2: a supervisor's restart may find the server back
    last = wrong.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune-bot: cannot use Redis at rediss://finetune:***@localhost:")
    assert "Traceback" not in wrong.stderr and "not-the-password" not in wrong.stderr
    assert not (tmp_path / "state" / "redis").exists()


@pytest.mark.parametrize(
    ("url", "remote"),
    [
        ("redis://:pw@cache.example.com:6379/0", True),
        ("redis://10.0.3.7:6379", True),
        ("redis://[2001:db8::7]:6379", True),
        ("redis://0.0.0.0:6379", True),
        ("redis://localhost:6379/0", False),
        ("redis://127.0.0.1:6379", False),
        ("redis://127.0.1.1:6379", False),
        ("redis://[::1]:6379", False),
        ("redis:///0", False),  # redis-py's default host: localhost
        ("rediss://:pw@cache.example.com:6379/0", False),
        ("unix:///run/valkey/valkey.sock", False),
    ],
)
def test_only_a_plain_redis_url_to_another_host_is_plaintext_remote(url: str, remote: bool) -> None:
    assert plaintext_remote(url) is remote


def test_a_remote_plain_redis_url_is_refused_unless_the_setting_says_so() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(redis_url="redis://:s3cret@cache.example.com:6379/0")
    assert str(caught.value) == (
        "REDIS_URL='redis://:***@cache.example.com:6379/0': Value error, redis:// to another host sends the password "
        "and the state in the clear; use rediss:// (TLS), or set FINETUNE_REDIS_ALLOW_PLAINTEXT=1 to accept that"
    )
    allowed = load_settings(redis_url="redis://:s3cret@cache.example.com:6379/0", finetune_redis_allow_plaintext=True)
    assert allowed.redis_url == "redis://:s3cret@cache.example.com:6379/0"
    assert load_settings(redis_url="rediss://:s3cret@cache.example.com:6379/0").redis_url is not None
    assert load_settings(redis_url="redis://127.0.0.1:6379/0").redis_url == "redis://127.0.0.1:6379/0"


@pytest.mark.scenario  # runs the bot's command line
def test_the_command_line_refuses_a_remote_plain_url_in_one_line_and_goes_on_when_told(tmp_path: Path) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no server answers there, so "went on" shows as the connection failing.
    url = "redis://:s3cret@192.0.2.1:6379/0?socket_connect_timeout=5"
    refused = _serve(tmp_path, REDIS_URL=url)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == (
        "finetune-bot: REDIS_URL='redis://:***@192.0.2.1:6379/0?socket_connect_timeout=5': Value error, redis:// to "
        "another host sends the password and the state in the clear; use rediss:// (TLS), or set "
        "FINETUNE_REDIS_ALLOW_PLAINTEXT=1 to accept that"
    )
    told = _serve(tmp_path, REDIS_URL=url, FINETUNE_REDIS_ALLOW_PLAINTEXT="1")
    assert told.returncode == 1, told.stderr  # past the settings: it tried the server, which is not there
    last = told.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune-bot: cannot use Redis at redis://:***@192.0.2.1:6379/0")
    for result in (refused, told):
        assert "Traceback" not in result.stderr and "s3cret" not in result.stderr
