"""The bot's secrets on Alibaba Cloud, read at boot from KMS Secrets Manager with the instance's RAM role.

The bot stack (deploy/aliyun/bot.ros.yaml) keeps the bot's secret settings (the Redis URL with its password, the
master report secret, the webhook token, the DingTalk secret) and its config file (which a team may put secrets in)
in two KMS secrets; the instance's user data holds none of them (user data is readable by any process on the
instance through the metadata service, and by anyone allowed ``DescribeUserData``). Its boot script runs::

    python -m bot.cloud.aliyun.secrets --region cn-hangzhou env-file finetune-bot/env >> bot.env
    python -m bot.cloud.aliyun.secrets --region cn-hangzhou value finetune-bot/config > config.yaml

``env-file`` prints a secret of ``NAME=value`` lines for a systemd environment file, all or nothing: a missing
secret, or a line that file would read otherwise than as written, prints nothing and exits 1 naming the secret and
the line's variable (never a value). ``value`` prints one secret as it is.

Credentials: ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``…_SECRET`` (tests), else the SDK's default chain, which on ECS
reads the RAM role named by ``ALIBABA_CLOUD_ECS_METADATA`` from the metadata service (with a session token only when
``ALIBABA_CLOUD_IMDSV1_DISABLED=true``). The API may not answer yet while the instance boots, so an unanswered call
is tried again a few times; a refusal (no such secret, no permission) is not.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from alibabacloud_credentials.client import Client as CredentialClient
from alibabacloud_tea_openapi.client import Client as OpenApiClient
from alibabacloud_tea_openapi.utils_models import Config, OpenApiRequest
from darabonba.runtime import RuntimeOptions

from bot.cloud.aliyun.errors import cloud_errors
from bot.cloud.aliyun.rpc import rpc_params
from bot.cloud.aliyun.settings import endpoint_parts
from bot.errors import CloudError, CloudRefused, CloudUnavailable

KMS_VERSION = "2016-01-20"
CONNECT_TIMEOUT_MS = 5_000
READ_TIMEOUT_MS = 15_000
ATTEMPTS = 5
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_SECRET_NAME = re.compile(r"[A-Za-z0-9_/+=.@-]{1,192}")
# What a systemd EnvironmentFile line carries as it is: printable ASCII without quotes, backslash or spaces.
_ENV_VALUE = re.compile(r"[!#-&(-\[\]-~]*")


def boot_config(region: str, endpoint: str) -> Config:
    """An OpenAPI client's configuration at boot: the test's key pair from the standard variables, else the
    instance's RAM role from the metadata service (the SDK's chain)."""
    config = Config(region_id=region, connect_timeout=CONNECT_TIMEOUT_MS, read_timeout=READ_TIMEOUT_MS)
    key_id = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
    key_secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    if key_id and key_secret:
        config.access_key_id, config.access_key_secret = key_id, key_secret
        config.security_token = os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN") or None
    else:
        config.credential = CredentialClient()  # the instance's RAM role, from the metadata service
    config.protocol, config.endpoint = endpoint_parts(endpoint)
    return config


class KmsSecrets:
    """``GetSecretValue`` of KMS Secrets Manager in one region (endpoint default ``kms.<region>.aliyuncs.com``)."""

    def __init__(self, region: str, endpoint: str | None = None) -> None:
        self._client = OpenApiClient(boot_config(region, endpoint or f"kms.{region}.aliyuncs.com"))
        self._runtime = RuntimeOptions(
            autoretry=False, connect_timeout=CONNECT_TIMEOUT_MS, read_timeout=READ_TIMEOUT_MS
        )

    def get(self, name: str) -> str:
        """The current version of secret ``name``; CloudError when KMS refuses, CloudUnavailable when silent."""
        if not _SECRET_NAME.fullmatch(name):
            raise CloudError(f"{name!r} is not a secret name")
        params = rpc_params("GetSecretValue", KMS_VERSION)
        try:
            with cloud_errors("GetSecretValue", "KMS"):
                request = OpenApiRequest(query={"SecretName": name})
                answer: dict[str, Any] = self._client.call_api(params, request, self._runtime)
        except CloudRefused as exc:  # one line, naming the secret and the code only
            raise CloudError(f"KMS refused secret {name}: {exc.code}") from None
        except CloudUnavailable as exc:
            raise CloudUnavailable(f"KMS did not answer for secret {name}: {type(exc.__cause__).__name__}") from None
        body = answer.get("body") or {}
        data = body.get("SecretData") if isinstance(body, dict) else None
        if not isinstance(data, str) or body.get("SecretDataType", "text") != "text":
            raise CloudError(f"secret {name} holds no text value")
        return data


def fetch(get: Callable[[str], str], name: str, attempts: int = ATTEMPTS, pause: float = 2.0) -> str:
    """``get(name)``, tried again (``pause``, doubling) while KMS does not answer."""
    for attempt in range(attempts):
        try:
            return get(name)
        except CloudUnavailable:
            if attempt == attempts - 1:
                raise
            time.sleep(pause * 2**attempt)
    raise AssertionError("unreachable")


def env_file(get: Callable[[str], str], secret: str) -> str:
    """Secret ``secret`` checked line by line as ``NAME=value`` (a value of printable ASCII without quotes, spaces
    or backslashes, which systemd reads as written); CloudError naming the first line that is not."""
    lines = fetch(get, secret).strip("\n").split("\n")
    for number, line in enumerate(lines, 1):
        variable, equals, value = line.partition("=")
        if not equals or not _ENV_NAME.fullmatch(variable):
            raise CloudError(f"secret {secret} line {number} is not NAME=value")
        if not _ENV_VALUE.fullmatch(value):
            raise CloudError(f"secret {secret}: {variable} holds characters an environment file would not keep")
    return "".join(line + "\n" for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bot.cloud.aliyun.secrets", description=__doc__.splitlines()[0])
    parser.add_argument("--region", required=True)
    parser.add_argument("--endpoint", help="KMS endpoint (default kms.<region>.aliyuncs.com)")
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env-file", help="print a secret of NAME=value lines, checked, for an environment file")
    env.add_argument("name")
    value = commands.add_parser("value", help="print one secret's value as it is")
    value.add_argument("name")
    args = parser.parse_args(argv)
    try:
        store = KmsSecrets(args.region, args.endpoint)
        if args.command == "env-file":
            sys.stdout.write(env_file(store.get, args.name))
        else:
            sys.stdout.write(fetch(store.get, args.name))
    except (CloudError, ValueError) as exc:
        print(f"finetune: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
