"""How every Alibaba Cloud API the bot calls through the generic OpenAPI client is addressed (STS, KMS, ECS at boot).

Alibaba's RPC-style APIs (``Action`` + ``Version`` in a form body, signed with the caller's key) share one request
shape; only the action and the API version differ. They also fail alike, mapped once by :mod:`bot.cloud.aliyun.errors`.
"""

from __future__ import annotations

from alibabacloud_tea_openapi.utils_models import Params


def rpc_params(action: str, version: str) -> Params:
    """The call ``action`` of API ``version``: HTTPS POST to ``/``, form body, JSON answer, signed with the key."""
    return Params(
        action=action,
        version=version,
        protocol="HTTPS",
        pathname="/",
        method="POST",
        auth_type="AK",
        style="RPC",
        req_body_type="formData",
        body_type="json",
    )
