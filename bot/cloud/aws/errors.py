"""botocore's errors (through aioboto3), mapped once to the bot's families: the one place in the bot that knows them.

Every botocore client the bot opens is handed out wrapped (:class:`MappedClient`): AWS's APIs by
:class:`bot.cloud.aws.clients.AwsClients`, S3-compatible object storage (AWS S3, Alibaba OSS) by the object writers.
A call either got an error answer (``ClientError``, with the API's code and message) or no usable answer at all
(:data:`_NO_ANSWER`: connection refused, a timeout, a reply botocore cannot parse, a hang-up the HTTP stack let
through). An API call's error answer becomes :class:`~bot.errors.CloudRefused` (its code and message), no answer
:class:`~bot.errors.CloudUnavailable` (:func:`cloud_errors`). An object call's (:func:`object_errors`) is mapped
the same way, naming the object, except that a 5xx still failing after botocore's retries is no answer either, so S3
and OSS fail alike. Past the wrapper only those two travel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from bot.errors import CloudRefused, CloudUnavailable

# No usable answer: botocore's own errors (EndpointConnectionError, ReadTimeoutError, NoCredentialsError…), a reply
# it cannot parse (ResponseParserError is no BotoCoreError), and what aiohttp or the socket let through.
_NO_ANSWER = (BotoCoreError, ResponseParserError, aiohttp.ClientError, OSError)

# How one call's failures are mapped: (the call's action, e.g. "DescribeInstances", its keyword arguments) -> a
# context manager that raises the family's errors.
ErrorMapping = Callable[[str, Mapping[str, Any]], AbstractContextManager[None]]


def _error_of(exc: ClientError) -> tuple[str, str]:
    """The (code, message) of an error answer."""
    error = exc.response.get("Error", {})
    return str(error.get("Code", "")), str(error.get("Message", ""))


def action_name(method: str) -> str:
    """botocore's snake-case method as the API's action (``describe_instances`` -> ``DescribeInstances``)."""
    return "".join(part.capitalize() for part in method.split("_"))


@contextlib.contextmanager
def cloud_errors(action: str, service: str) -> Iterator[None]:
    """One call ``action`` of ``service`` ("EC2", "Auto Scaling", …), its failures as the cloud port's: an error
    answer is :class:`~bot.errors.CloudRefused`, no answer :class:`~bot.errors.CloudUnavailable`."""
    try:
        yield
    except ClientError as exc:
        code, message = _error_of(exc)
        raise CloudRefused(action, code or "Unknown", message or str(exc)) from exc
    except _NO_ANSWER as exc:
        raise CloudUnavailable(f"{service} did not answer {action}: {exc}") from exc


@contextlib.contextmanager
def object_errors(action: str, uri: str, store: str) -> Iterator[None]:
    """One object call ``action`` on ``uri`` (``s3://…``, ``oss://…``) of ``store`` ("S3", "OSS"), its failures as
    the cloud's errors: an error code is :class:`~bot.errors.CloudRefused` (its ``action`` the call and the object);
    a 5xx still failing after botocore's retries, or no answer, :class:`~bot.errors.CloudUnavailable` (trying later
    may work)."""
    where = f"{action} {uri}"
    try:
        yield
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code, message = _error_of(exc)
        code = code or (f"HTTP {status}" if status else "Unknown")
        message = message or str(exc)
        if status:
            message = f"{message} (HTTP {status})"
        if isinstance(status, int) and status >= 500:
            raise CloudUnavailable(f"{where}: {store} answered {code}: {message}") from exc
        raise CloudRefused(where, code, message) from exc
    except _NO_ANSWER as exc:
        raise CloudUnavailable(f"{where}: no answer from {store}: {exc}") from exc


def api_mapping(service: str) -> ErrorMapping:
    """The mapping of an AWS API client (EC2, Auto Scaling, FIS, STS)."""
    return lambda action, _: cloud_errors(action, service)


def object_mapping(scheme: str, store: str) -> ErrorMapping:
    """The mapping of an object store's client: its errors name the object (``<scheme>://<bucket>/<key>``)."""

    def mapping(action: str, params: Mapping[str, Any]) -> AbstractContextManager[None]:
        uri = f"{scheme}://{params.get('Bucket', '')}/{params.get('Key', '')}"
        return object_errors(action, uri, store)

    return mapping


class MappedClient:
    """A botocore client whose every call (and every page of a paginator) raises the bot's families, never
    botocore's: the call sites catch :class:`~bot.errors.CloudError` subclasses only.
    Attributes that are not calls (``meta``) are the client's own."""

    def __init__(self, client: Any, mapping: ErrorMapping) -> None:
        self._client = client
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        if name.startswith("_") or name in ("meta", "exceptions") or not callable(found):
            return found
        if name == "get_paginator":
            return lambda operation: _MappedPaginator(found(operation), action_name(operation), self._mapping)
        action = action_name(name)

        async def call(**params: Any) -> Any:
            with self._mapping(action, params):
                return await found(**params)

        return call


class _MappedPaginator:
    def __init__(self, paginator: Any, action: str, mapping: ErrorMapping) -> None:
        self._paginator = paginator
        self._action = action
        self._mapping = mapping

    def paginate(self, **params: Any) -> AsyncIterator[Any]:
        return self._pages(params)

    async def _pages(self, params: dict[str, Any]) -> AsyncIterator[Any]:
        with self._mapping(self._action, params):
            async for page in self._paginator.paginate(**params):
                yield page
