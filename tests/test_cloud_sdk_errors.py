"""One mapping per cloud: every kind of SDK exception the providers rely on comes out of its cloud's one mapping
module as the right class of the bot's families (``bot/errors.py``), and no other module of the product knows an SDK's
exceptions.

- botocore (AWS's APIs, S3 and OSS objects): ``bot/cloud/aws/errors.py``; an API call's error answer is
  ``CloudRefused`` with its code, no answer ``CloudUnavailable``; an object call's the same naming the object, a 5xx
  being no answer too. The wrapper every AWS client is handed out in applies it to each call and
  each paginated page (checked here on a real aioboto3 client with nothing listening; moto's error answers through
  the provider: tests/test_aws_errors.py).
- the Tea / darabonba SDK (ECS, ESS, STS, KMS): ``bot/cloud/aliyun/errors.py``; an answer with a code is
  ``CloudRefused``, a request the SDK will not send ``CloudRefused`` ``InvalidRequest``, no answer ``CloudUnavailable``
  (through the real API client against the fake: tests/test_aliyun_api_errors.py).

The exceptions below are the SDKs' own classes, raised as the SDKs raise them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aioboto3  # type: ignore[import-untyped]
import aiohttp
import pytest
from alibabacloud_tea_openapi.exceptions import ClientException, ServerException, ThrottlingException
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError
from darabonba.exceptions import RequiredArgumentException as DaraRequiredArgument
from darabonba.exceptions import RetryError as DaraRetryError
from Tea.exceptions import RetryError as TeaRetryError
from Tea.exceptions import TeaException
from Tea.exceptions import ValidateException as TeaValidateException

from bot.cloud.aliyun.errors import cloud_errors as aliyun_errors
from bot.cloud.aws.errors import MappedClient, api_mapping, object_errors
from bot.cloud.aws.errors import cloud_errors as aws_errors
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from fakes.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


def client_error(code: str | None, message: str = "", status: int = 400) -> ClientError:
    """A ClientError as botocore builds it from an error answer (``code`` None: an answer without one)."""
    error = {"Code": code, "Message": message} if code is not None else {}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "SomeOperation")


# Every botocore kind the AWS provider relies on, and the class an API call's mapping gives it.
BOTOCORE_API: list[tuple[Exception, type[CloudError], str | None]] = [
    (client_error("InvalidInstanceID.NotFound", "no such instance"), CloudRefused, "InvalidInstanceID.NotFound"),
    (client_error("InsufficientInstanceCapacity", "none left", 500), CloudRefused, "InsufficientInstanceCapacity"),
    (client_error("UnauthorizedOperation", "", 403), CloudRefused, "UnauthorizedOperation"),
    (client_error(None, status=500), CloudRefused, "Unknown"),  # moto's HTTP 500 for an API it lacks
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), CloudUnavailable, None),
    (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), CloudUnavailable, None),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), CloudUnavailable, None),
    (NoCredentialsError(), CloudUnavailable, None),
    (ResponseParserError("not XML"), CloudUnavailable, None),  # no BotoCoreError
    (aiohttp.ServerDisconnectedError(), CloudUnavailable, None),
    (ConnectionResetError("reset by peer"), CloudUnavailable, None),
]


@pytest.mark.parametrize(("raised", "mapped", "code"), BOTOCORE_API, ids=lambda v: type(v).__name__)
def test_each_botocore_failure_of_an_api_call_maps_to_its_family_class(
    raised: Exception, mapped: type[CloudError], code: str | None
) -> None:
    with pytest.raises(CloudError) as caught, aws_errors("TerminateInstances", "EC2"):
        raise raised
    assert type(caught.value) is mapped and caught.value.__cause__ is raised
    if isinstance(caught.value, CloudRefused):
        assert (caught.value.action, caught.value.code) == ("TerminateInstances", code)
    else:
        assert str(caught.value).startswith("EC2 did not answer TerminateInstances")


@pytest.mark.parametrize(
    ("raised", "mapped", "code"),
    [
        (client_error("NoSuchBucket", "gone", 404), CloudRefused, "NoSuchBucket"),
        (client_error("AccessDenied", "", 403), CloudRefused, "AccessDenied"),
        (client_error(None, status=403), CloudRefused, "HTTP 403"),
        (client_error("InternalError", "try again", 500), CloudUnavailable, None),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), CloudUnavailable, None),
        (ResponseParserError("not XML"), CloudUnavailable, None),
        (aiohttp.ServerDisconnectedError(), CloudUnavailable, None),
        (ConnectionResetError("reset by peer"), CloudUnavailable, None),
    ],
    ids=lambda v: type(v).__name__,
)
def test_each_botocore_failure_of_an_object_call_maps_to_the_clouds_class_naming_the_object(
    raised: Exception, mapped: type[Exception], code: str | None
) -> None:
    with pytest.raises(Exception) as caught, object_errors("PutObject", "oss://bucket/ft/spec.json", "OSS"):
        raise raised
    assert type(caught.value) is mapped and caught.value.__cause__ is raised
    assert "PutObject oss://bucket/ft/spec.json" in str(caught.value)
    if isinstance(caught.value, CloudRefused):
        assert caught.value.code == code


async def test_the_wrapped_client_maps_calls_and_pages_and_passes_the_rest_through() -> None:
    """A real aioboto3 EC2 client with nothing listening: a call and a paginated listing both come out as
    CloudUnavailable naming the action; ``meta`` is the client's own."""
    session = aioboto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1")
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=2)
    async with session.client("ec2", endpoint_url=f"http://127.0.0.1:{free_port()}", config=config) as raw:
        ec2 = MappedClient(raw, api_mapping("EC2"))
        assert ec2.meta.region_name == "us-east-1"
        with pytest.raises(CloudUnavailable, match="EC2 did not answer DescribeInstances") as call:
            await ec2.describe_instances(InstanceIds=["i-0123456789abcdef0"])
        assert isinstance(call.value.__cause__, EndpointConnectionError)
        with pytest.raises(CloudUnavailable, match="EC2 did not answer DescribeSpotPriceHistory"):
            async for _ in ec2.get_paginator("describe_spot_price_history").paginate(InstanceTypes=["g5.xlarge"]):
                pass


# Every Tea / darabonba kind the Alibaba provider relies on, and the class the mapping gives it.
ALIBABA: list[tuple[Exception, type[CloudError], str | None]] = [
    (ClientException(code="InvalidInstanceId.NotFound", message="no such instance", status_code=404), CloudRefused,
     "InvalidInstanceId.NotFound"),
    (ServerException(code="ServiceUnavailable", message="later", status_code=503), CloudRefused, "ServiceUnavailable"),
    (ThrottlingException(code="Throttling.User", message="slow down", status_code=400), CloudRefused,
     "Throttling.User"),
    (ClientException(code="OperationDenied.NoStock", data={"Message": "no stock"}), CloudRefused,
     "OperationDenied.NoStock"),
    (TeaValidateException("InstanceId is exceed max-length: 64"), CloudRefused, "InvalidRequest"),
    (DaraRequiredArgument("RegionId"), CloudRefused, "InvalidRequest"),
    (TeaException({"code": "", "message": "Connection refused"}), CloudUnavailable, None),
    (TeaRetryError("retry"), CloudUnavailable, None),
    (DaraRetryError("retry"), CloudUnavailable, None),
    (ConnectionResetError("reset by peer"), CloudUnavailable, None),
]  # fmt: skip


@pytest.mark.parametrize(("raised", "mapped", "code"), ALIBABA, ids=lambda v: type(v).__name__)
def test_each_alibaba_sdk_failure_maps_to_its_family_class(
    raised: Exception, mapped: type[CloudError], code: str | None
) -> None:
    with pytest.raises(CloudError) as caught, aliyun_errors("RunInstances", "Alibaba Cloud"):
        raise raised
    assert type(caught.value) is mapped and caught.value.__cause__ is raised
    if isinstance(caught.value, CloudRefused):
        assert (caught.value.action, caught.value.code) == ("RunInstances", code)
    else:
        assert str(caught.value).startswith("RunInstances: no answer from Alibaba Cloud")


def test_an_alibaba_answer_keeps_its_message() -> None:
    with pytest.raises(CloudRefused) as caught, aliyun_errors("RunInstances", "Alibaba Cloud"):
        raise ClientException(code="OperationDenied.NoStock", data={"Message": "no stock in cn-hangzhou-j"})
    assert caught.value.message == "no stock in cn-hangzhou-j"


# Where each SDK's exceptions may be named: its cloud's one mapping module, nowhere else in the product (the runner, a
# process of its own that never imports the bot, maps botocore's for its own stores: runner/storage/s3.py).
SDK_ERRORS = {
    "botocore": ({"botocore.exceptions", "botocore.parsers", "botocore.errorfactory"}, "bot/cloud/aws/errors.py"),
    "alibaba": (
        {"Tea.exceptions", "darabonba.exceptions", "alibabacloud_tea_openapi.exceptions"},
        "bot/cloud/aliyun/errors.py",
    ),
}
PRODUCT = ("bot", "handlers", "fakes", "bench")


def sdk_error_modules(source: str, modules: set[str]) -> set[str]:
    """Which of ``modules`` the source imports or names (``import botocore.exceptions``, ``from botocore.exceptions
    import …``, ``from botocore import exceptions``, ``botocore.exceptions.ClientError``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module:
            named = {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            found.update(named & modules)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found.update({f"{node.value.id}.{node.attr}"} & modules)
    return found


def test_the_rule_sees_every_way_of_naming_an_sdk_error() -> None:
    modules = SDK_ERRORS["botocore"][0]
    for source in (
        "from botocore.exceptions import ClientError\n",
        "import botocore.exceptions\n",
        "from botocore import exceptions\n",
        "import botocore\ntry:\n    pass\nexcept botocore.exceptions.ClientError:\n    pass\n",
        "def later():\n    from botocore.parsers import ResponseParserError\n",
    ):
        assert sdk_error_modules(source, modules), source
    assert not sdk_error_modules("from botocore.config import Config\nimport botocore.session\n", modules)


@pytest.mark.parametrize("sdk", sorted(SDK_ERRORS))
def test_only_the_clouds_mapping_module_knows_its_sdks_errors(sdk: str) -> None:
    modules, home = SDK_ERRORS[sdk]
    found = {
        str(path.relative_to(ROOT)): named
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (named := sdk_error_modules(path.read_text(), modules))
    }
    assert set(found) == {home}, f"map {sdk}'s errors in {home} only: {found}"


def test_no_platform_error_class() -> None:
    """The clouds' packages define no error class of their own (no ``AwsError`` beside ``CloudError``, no
    ``AwsUnavailable`` on two branches): every provider raises the cloud port's families of bot/errors.py, so a caller
    anywhere catches a family, whichever cloud it runs on."""
    errors = ("Error", "Exception", "Unavailable", "Refused", "Instance")
    defined = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        for path in sorted((ROOT / "bot/cloud").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id.endswith(errors) for base in node.bases)
    ]
    assert defined == []
