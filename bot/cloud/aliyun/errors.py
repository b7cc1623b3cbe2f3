"""The Tea / darabonba SDK's errors (ECS, ESS, STS, KMS), mapped once to the cloud port's family: the one place in the
bot that knows them.

Every Alibaba call runs inside :func:`cloud_errors`: the API client's (:class:`bot.cloud.aliyun.api.AliyunApi`) and
the boot helpers' (:mod:`bot.cloud.aliyun.secrets`, :mod:`bot.cloud.aliyun.metadata`). An answer with an error
``Code`` (the SDK's ``ClientException`` / ``ServerException`` / ``ThrottlingException``) becomes
:class:`~bot.errors.CloudRefused` (code and message); a request the SDK refuses to send (its ``ValidateException`` /
``RequiredArgumentException``, Tea's or darabonba's) a :class:`~bot.errors.CloudRefused` with code
``InvalidRequest``; no usable answer (connection refused, a hang-up, a timeout, a body that is not JSON: darabonba's
``UnretryableException`` and the rest of the ``TeaException`` family, its ``RetryError``, an ``OSError``)
:class:`~bot.errors.CloudUnavailable`. Past it only those travel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alibabacloud_tea_openapi.exceptions import AlibabaCloudException
from darabonba.exceptions import RetryError as DaraRetryError
from darabonba.exceptions import ValidateException as DaraValidateException
from Tea.exceptions import RetryError as TeaRetryError
from Tea.exceptions import TeaException
from Tea.exceptions import ValidateException as TeaValidateException

from bot.errors import CloudRefused, CloudUnavailable

# The API answered with an error Code (ClientException, ServerException, ThrottlingException). Caught first: it is a
# TeaException too.
_ANSWERED_ERROR: tuple[type[Exception], ...] = (AlibabaCloudException,)
# The SDK refused to send the request (a model that fails its own checks; RequiredArgumentException is one).
_NOT_SENT: tuple[type[Exception], ...] = (TeaValidateException, DaraValidateException)
# No usable answer: refused, hung up, timed out, not JSON (UnretryableException wraps them), or the SDK's own
# RetryError, or an OSError the HTTP stack let through.
_NO_ANSWER: tuple[type[Exception], ...] = (TeaException, TeaRetryError, DaraRetryError, OSError)


@contextlib.contextmanager
def cloud_errors(action: str, service: str) -> Iterator[None]:
    """One call ``action`` (``RunInstances``, ``GetSecretValue``…) of ``service`` ("Alibaba Cloud", "Alibaba Cloud
    STS"…), the SDK's exceptions as the cloud port's (see the module docstring for which is which)."""
    try:
        yield
    except _ANSWERED_ERROR as exc:
        assert isinstance(exc, AlibabaCloudException)
        data = exc.data if isinstance(exc.data, dict) else {}
        message = str(data.get("Message") or data.get("message") or exc.message or "")
        raise CloudRefused(action, str(exc.code or "Unknown"), message) from exc
    except _NOT_SENT as exc:
        raise CloudRefused(action, "InvalidRequest", f"the SDK refused to send it: {exc}") from exc
    except _NO_ANSWER as exc:
        raise CloudUnavailable(f"{action}: no answer from {service}: {exc}") from exc
