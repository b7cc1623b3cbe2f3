"""The Alibaba SDK's one mapping (bot/cloud/aliyun/errors.py, at the API client bot/cloud/aliyun/api.py): whatever the
Tea / darabonba SDK raises for an ECS, ESS or STS call comes out as :class:`~bot.errors.CloudRefused` (an answer with a
code) or :class:`~bot.errors.CloudUnavailable` (no usable answer), both :class:`bot.errors.CloudError`.

The failures come from real servers: the local OpenAPI double answering error codes (the SDK's ClientException,
ServerException and ThrottlingException by status), a port nothing listens on, and a small HTTP server answering
the broken ways a load balancer or a dying endpoint does (an HTML 502, a 200 that is not JSON, an empty 500, a
hang-up). Only the SDK's client-side ValidateException, which no server can cause, is injected at the SDK's own
boundary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from alibabacloud_ecs20140526 import models as ecs_models
from alibabacloud_ecs20140526.client import Client as EcsClient
from alibabacloud_ess20220222 import models as ess_models
from darabonba.exceptions import RequiredArgumentException
from Tea.exceptions import ValidateException

from bot.cloud.aliyun.api import AliyunApi
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from fakes.ports import free_port
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun
from tests.broken_http import WAYS, BrokenHttp

REGION = "cn-hangzhou"
Call = Callable[[AliyunApi], Awaitable[Any]]

# One call of each client the edge holds: ECS and ESS through their SDKs, STS through the generic OpenAPI client.
CALLS: dict[str, Call] = {
    "ecs": lambda api: api.ecs("describe_instances", ecs_models.DescribeInstancesRequest(region_id=REGION)),
    "ess": lambda api: api.ess("describe_scaling_groups", ess_models.DescribeScalingGroupsRequest(region_id=REGION)),
    "sts": lambda api: api.assume_role("acs:ram::1:role/none", "s", "{}", 900),
}


def api_at(endpoint: str, key_id: str = ACCESS_KEY_ID) -> AliyunApi:
    return AliyunApi(
        REGION,
        endpoint=endpoint,
        ess_endpoint=endpoint,
        sts_endpoint=endpoint,
        access_key_id=key_id,
        access_key_secret=ACCESS_KEY_SECRET,
    )


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeAliyun]:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    started = await FakeAliyun(REGION).start()
    yield started
    await started.stop()


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda api: api.ecs("delete_instance", ecs_models.DeleteInstanceRequest(instance_id="i-none")),
         "InvalidInstanceId.NotFound"),  # 4xx: ClientException
        (lambda api: api.ecs("describe_spot_price_history", ecs_models.DescribeSpotPriceHistoryRequest(
            region_id=REGION, instance_type="ecs.g7.large", network_type="vpc")), "ServiceUnavailable"),  # 5xx
        (CALLS["sts"], "NoPermission"),  # the generic client's path
    ],
    ids=["client-error", "server-error", "sts-refusal"],
)  # fmt: skip
async def test_an_answer_with_a_code_is_an_api_error(fake: FakeAliyun, call: Call, code: str) -> None:
    fake.fail_price_history = True
    with pytest.raises(CloudRefused) as caught:
        await call(api_at(fake.endpoint))
    assert caught.value.code == code and isinstance(caught.value, CloudError)


async def test_throttling_and_a_wrong_key_are_api_errors_for_every_client(fake: FakeAliyun) -> None:
    fake.run_fault = lambda params: "Throttling.User"
    run = ecs_models.RunInstancesRequest(
        region_id=REGION, zone_id="cn-hangzhou-j", instance_type="ecs.g7.large", image_id="img-1"
    )
    with pytest.raises(CloudRefused) as throttled:
        await api_at(fake.endpoint).ecs("run_instances", run)
    assert throttled.value.code == "Throttling.User"
    for name, call in CALLS.items():
        with pytest.raises(CloudRefused) as refused:
            await call(api_at(fake.endpoint, key_id="LTAI-not-a-key"))
        assert refused.value.code == "InvalidAccessKeyId.NotFound", name


@pytest.mark.parametrize("how", WAYS)
async def test_a_broken_answer_is_unavailable(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    server = await BrokenHttp(how).start()
    try:
        for name, call in CALLS.items():
            with pytest.raises(CloudUnavailable) as caught:
                await call(api_at(server.endpoint))
            assert isinstance(caught.value, CloudUnavailable), name
    finally:
        await server.stop()


async def test_nothing_listening_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    api = api_at(f"http://127.0.0.1:{free_port()}")
    for name, call in CALLS.items():
        with pytest.raises(CloudUnavailable, match="no answer from Alibaba Cloud"):
            await call(api)
        assert name


@pytest.mark.parametrize("refusal", [ValidateException("InstanceId is exceed max-length: 64"),
                                     RequiredArgumentException("RegionId")])  # fmt: skip
async def test_a_request_the_sdk_will_not_send_is_an_api_error(
    fake: FakeAliyun, monkeypatch: pytest.MonkeyPatch, refusal: Exception
) -> None:
    """Injected at the SDK's boundary: no server can make the SDK's own model checks fail (the ECS models the bot
    sends carry no checks today; a newer SDK's may)."""

    def refuse(self: EcsClient, request: Any, runtime: Any) -> Any:
        raise refusal

    monkeypatch.setattr(EcsClient, "describe_instances_with_options", refuse)
    with pytest.raises(CloudRefused) as caught:
        await CALLS["ecs"](api_at(fake.endpoint))
    assert caught.value.code == "InvalidRequest" and caught.value.__cause__ is refusal
    assert fake.calls == []
