"""Checkpoints follow the job across regions, and the job pays for the bytes (issue 51, item 4), on the real bot.

One bucket in the home region (moto, eu-west-1) behind the S3 proxy, which sees how every request is signed; the
local cloud's zones span two regions (``eu-west-1a`` home, ``us-west-2a`` away) and its instances run the real
runner with the bucket's region (``FINETUNE_STORAGE_REGION``, as AWS user data sets it). Spot goes in the home zone:
the job is reclaimed there and relaunched in the other region, whose runner restores from the home bucket and commits
to it, every request signed for the bucket's region. The away attempt pays the transfer price for those bytes; the
card says ``egress $…`` and ``costs`` counts it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.chat.costs import costs_text
from bot.chat.render import card_text
from bot.cloud.local.provider import LocalCloud
from bot.service import CloudWiring, open_cloud
from fakes.bot_harness import CHANNEL, running_bot, start_job, wait_job, write_config
from handlers.cost_report import cost_report
from handlers.job_cost import job_cost
from handlers.jobs import JobState
from handlers.regions import transfer_cost
from tests.s3_proxy import S3FaultProxy
from tests.trainers import synthetic

HOME, AWAY = "eu-west-1", "us-west-2"
BUCKET = "ft-home"
# A price that makes a few KiB of synthetic checkpoints show in cents (AWS's is 0.02: the arithmetic is the same).
PRICE_PER_GB = 20_000.0
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/s3/aws4_request")


def signing_regions(proxy: S3FaultProxy) -> set[str]:
    """The regions every request through the proxy was signed for (SigV4's credential scope)."""
    return {found.group(1) for authorization, _ in proxy.credentials if (found := _SCOPE.search(authorization))}


def priced_cloud(wiring: CloudWiring) -> Any:
    cloud = open_cloud(wiring)
    assert isinstance(cloud, LocalCloud)
    cloud.transfer_price_per_gb = PRICE_PER_GB
    return cloud


async def test_a_job_reclaimed_at_home_restores_in_another_region_and_pays_the_transfer(
    tmp_path: Path, proxy: S3FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = boto3.client("s3", endpoint_url=proxy.upstream, region_name=HOME)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": HOME})
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # the runners' way to the bucket
    monkeypatch.setenv("AWS_REGION", AWAY)  # what an instance of the other region has as its own
    monkeypatch.setenv("AWS_DEFAULT_REGION", AWAY)
    monkeypatch.setenv("FINETUNE_STORAGE_REGION", HOME)  # the bucket's, as the bot's user data says it
    config = write_config(tmp_path / "bot.yaml", recipes=[synthetic.recipe()], policy={"admins": ["console:ana"]})
    async with running_bot(
        tmp_path / "state",
        config,
        grace=5.0,
        cloud=priced_cloud,
        finetune_local_zones=f"{HOME}a,{AWAY}a",
        finetune_local_checkpoints=f"s3://{BUCKET}/team",
    ) as (service, _chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud) and cloud.home_region == HOME
        # 15 s of steps: still training when the capacity goes after its first checkpoint (every step after the
        # move is only waited for).
        job_id = await start_job(service, "console:ana", "start synthetic steps=100 step_seconds=0.15 save_steps=10")
        job = await wait_job(service, job_id, lambda job: job.checkpoint is not None and (job.step or 0) >= 8)
        first = job.attempts[0]
        assert first.zone == f"{HOME}a" and first.egress_price_per_gb == 0.0
        assert await cloud.take_spot_capacity(f"{HOME}a") == [first.instance_id]

        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        home, away = done.attempts
        assert away.zone == f"{AWAY}a" and away.resumed_from_step is not None and away.resumed_from_step > 0
        assert away.egress_price_per_gb == PRICE_PER_GB
        assert home.moved_bytes > 0  # it committed too, but inside the bucket's region: free
        # The away runner restored a checkpoint and committed at least one more: both crossed.
        assert away.moved_bytes > 10 * 1024 * 2

        cost = job_cost(done, done.updated_at)
        assert cost.egress == pytest.approx(transfer_cost(away.moved_bytes, PRICE_PER_GB)) and cost.egress > 0.01
        unmoved = done.model_copy(update={"attempts": [home, away.model_copy(update={"moved_bytes": 0})]})
        assert cost.paid == pytest.approx(job_cost(unmoved, done.updated_at).paid + cost.egress)
        card = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert f"egress ${cost.egress:.4f}" in card and card == card_text(done, done.updated_at)
        costs = await service.bot.command("console:ana", CHANNEL, "costs")
        report = cost_report([done], "7d", done.updated_at)
        assert report.total.egress == pytest.approx(cost.egress)
        assert f"(egress ${cost.egress:.2f})" in costs, costs
        assert costs.splitlines()[1] == costs_text(report, "en").splitlines()[1]  # the total's line

    # Every request of every runner, the away one's included, was signed for the bucket's region.
    assert signing_regions(proxy) == {HOME}
