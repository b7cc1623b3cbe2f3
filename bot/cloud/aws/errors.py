"""What botocore (through aioboto3) raises for one call, sorted once for every botocore client the bot opens: AWS's
APIs and S3-compatible object storage (AWS S3, Alibaba OSS).

A call either got an error answer (``ClientError``, with AWS's code and message) or no usable answer at all
(:data:`NO_ANSWER`: connection refused, a timeout, a reply botocore cannot parse, a hang-up the HTTP stack let
through). Each edge catches :data:`FAILED` (or the two apart) and raises its own family of ``bot/errors.py``;
object writes all map through :func:`object_errors`, so S3 and OSS fail alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from bot.errors import ObjectRefused, ObjectStoreUnavailable

# No usable answer: botocore's own errors (EndpointConnectionError, ReadTimeoutError, NoCredentialsError…), a reply
# it cannot parse (ResponseParserError is no BotoCoreError), and what aiohttp or the socket let through.
NO_ANSWER = (BotoCoreError, ResponseParserError, aiohttp.ClientError, OSError)
# Any failure of a call: an error answer, or none.
FAILED = (ClientError, *NO_ANSWER)


def error_of(exc: ClientError) -> tuple[str, str]:
    """The (code, message) of an error answer."""
    error = exc.response.get("Error", {})
    return str(error.get("Code", "")), str(error.get("Message", ""))


@contextlib.contextmanager
def object_errors(action: str, uri: str, store: str) -> Iterator[None]:
    """One object call ``action`` on ``uri`` (``s3://…``, ``oss://…``) of ``store`` ("S3", "OSS"), its failures as
    the object store's errors: an error code is :class:`~bot.errors.ObjectRefused`; a 5xx still failing after
    botocore's retries, or no answer, :class:`~bot.errors.ObjectStoreUnavailable` (trying later may work)."""
    where = f"{action} {uri}"
    try:
        yield
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code, message = error_of(exc)
        code = code or (f"HTTP {status}" if status else "Unknown")
        message = message or str(exc)
        if status:
            message = f"{message} (HTTP {status})"
        if isinstance(status, int) and status >= 500:
            raise ObjectStoreUnavailable(f"{where}: {store} answered {code}: {message}") from exc
        raise ObjectRefused(where, code, message) from exc
    except NO_ANSWER as exc:
        raise ObjectStoreUnavailable(f"{where}: no answer from {store}: {exc}") from exc
