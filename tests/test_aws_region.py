"""Every AWS client's region comes from one place, in one order: aws.region, AWS_REGION, AWS_DEFAULT_REGION, the
profile (bot/cloud/aws/region.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.region import Region, find_region
from bot.cloud.aws.settings import AwsSettings

SETTINGS = {"bucket": "my-finetune-checkpoints", "image_id": "ami-0abc"}


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No region anywhere: no variable, and a profile file of our own (empty until a test writes it)."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return config


def test_the_order_is_config_then_aws_region_then_aws_default_region_then_the_profile(
    no_region: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_region(None) is None
    no_region.write_text("[default]\nregion = eu-west-1\n")
    assert find_region(None) == Region("eu-west-1", "the AWS profile")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert find_region(None) == Region("us-west-2", "AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert find_region(None) == Region("ap-south-1", "AWS_REGION")
    assert find_region("us-east-2") == Region("us-east-2", "aws.region")


def test_an_empty_variable_counts_as_unset(no_region: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", " ")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert find_region(None) == Region("us-west-2", "AWS_DEFAULT_REGION")


def test_the_providers_clients_use_the_same_region(no_region: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert AwsClients(AwsSettings(**SETTINGS)).region == "ap-south-1"
    assert AwsClients(AwsSettings(**SETTINGS, region="us-east-2")).region == "us-east-2"
