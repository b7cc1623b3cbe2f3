"""bot.cloud.aliyun.secrets, run as the bot instance's boot script runs it, against the local Alibaba API (KMS
GetSecretValue, ACS3-signed): what it prints is what the stack stored, and a secret it cannot use prints nothing."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def kms() -> AsyncIterator[FakeAliyun]:
    fake = await FakeAliyun().start()
    yield fake
    await fake.stop()


async def run(kms: FakeAliyun, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ACCESS_KEY_SECRET,
        "PYTHONPATH": str(ROOT),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cloud.aliyun.secrets", "--region", "cn-hangzhou", "--endpoint", kms.endpoint, *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    return int(process.returncode or 0), out.decode(), err.decode()


async def test_an_env_file_secret_and_a_plain_one_come_out_as_stored(kms: FakeAliyun) -> None:
    kms.secrets["finetune-bot/env"] = "REDIS_URL=rediss://:pw@r-1:6379/0?ssl_ca_certs=/etc/ca.pem\nEMPTY=\n"
    kms.secrets["finetune-bot/config"] = "policy:\n  max_concurrent_nodes: 2\n"
    assert await run(kms, "env-file", "finetune-bot/env") == (
        0,
        "REDIS_URL=rediss://:pw@r-1:6379/0?ssl_ca_certs=/etc/ca.pem\nEMPTY=\n",
        "",
    )
    assert await run(kms, "value", "finetune-bot/config") == (0, "policy:\n  max_concurrent_nodes: 2\n", "")
    assert kms.rejected == []  # signed with the key it was given


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        ("GOOD=1\nBAD=two words-hunter2", "finetune-bot/env: BAD holds characters"),
        ('QUOTED="hunter2"', "finetune-bot/env: QUOTED holds characters"),
        ("GOOD=1\nnot a line hunter2", "finetune-bot/env line 2 is not NAME=value"),
    ],
)
async def test_an_env_file_a_systemd_file_would_misread_prints_nothing(kms: FakeAliyun, stored: str, why: str) -> None:
    kms.secrets["finetune-bot/env"] = stored
    status, out, err = await run(kms, "env-file", "finetune-bot/env")
    assert (status, out) == (1, "") and why in err
    assert "hunter2" not in err  # the name of what is wrong, never a value


async def test_a_secret_kms_does_not_have_is_a_clear_failure(kms: FakeAliyun) -> None:
    status, out, err = await run(kms, "value", "finetune-bot/nothing")
    assert (status, out) == (1, "")
    assert "KMS refused secret finetune-bot/nothing: Forbidden.ResourceNotFound" in err
