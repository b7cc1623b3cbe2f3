"""How every Alibaba Cloud API the bot calls through the generic OpenAPI client is addressed (STS, KMS, ECS at boot).

Alibaba's RPC-style APIs (``Action`` + ``Version`` in a form body, signed with the caller's key) share one request
shape; only the action and the API version differ. They also fail alike: what the Tea / darabonba SDK can raise
for one call falls into the three tuples below, which every Alibaba edge maps to its own errors.
"""

from __future__ import annotations

from alibabacloud_tea_openapi.exceptions import AlibabaCloudException
from alibabacloud_tea_openapi.utils_models import Params
from darabonba.exceptions import RetryError as DaraRetryError
from darabonba.exceptions import ValidateException as DaraValidateException
from Tea.exceptions import RetryError as TeaRetryError
from Tea.exceptions import TeaException
from Tea.exceptions import ValidateException as TeaValidateException

# The API answered with an error Code (ClientException, ServerException, ThrottlingException). Catch it first: it
# is a TeaException too.
ANSWERED_ERROR: tuple[type[Exception], ...] = (AlibabaCloudException,)
# The SDK refused to send the request (a model that fails its own checks; RequiredArgumentException is one).
NOT_SENT: tuple[type[Exception], ...] = (TeaValidateException, DaraValidateException)
# No usable answer: refused, hung up, timed out, not JSON (UnretryableException wraps them), or the SDK's own
# RetryError, or an OSError the HTTP stack let through.
NO_ANSWER: tuple[type[Exception], ...] = (TeaException, TeaRetryError, DaraRetryError, OSError)


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
