"""The dependency rules of DESIGN.md, checked on what each entry point actually loads."""

from __future__ import annotations

import subprocess
import sys


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(name.split('.')[0] for name in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_the_runner_agent_stays_light() -> None:
    loaded = loaded_after("runner.cli")
    assert not loaded & {"torch", "transformers", "peft", "slack_bolt", "slack_sdk", "dingtalk_stream", "redis", "bot"}


def test_handlers_need_no_io_library() -> None:
    loaded = loaded_after(
        "handlers.decide, handlers.commands, handlers.aws_events, handlers.spot, handlers.spot.zones, "
        "handlers.aliyun_events"
    )
    assert not loaded & {"aiohttp", "boto3", "botocore", "aiobotocore", "redis", "slack_bolt", "bot", "runner"}


def test_the_bot_does_not_load_torch() -> None:
    assert not loaded_after("bot.service") & {"torch", "transformers", "peft"}


def test_alibabas_sdks_load_only_with_the_alibaba_provider() -> None:
    """They take about a second to import: a bot on another cloud (or the console chat) never pays for it."""
    sdks = {"alibabacloud_ecs20140526", "alibabacloud_ess20220222", "alibabacloud_tea_openapi"}
    assert not loaded_after("bot.service") & sdks
    assert loaded_after("bot.cloud.aliyun") >= sdks
