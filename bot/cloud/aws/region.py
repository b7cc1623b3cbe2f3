"""Where every AWS client the bot opens takes its region from: one place, one order.

``aws.region`` in the config file, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else botocore's own chain (the
profile's ``region`` in ``~/.aws/config``). botocore alone reads ``AWS_DEFAULT_REGION`` and the profile, not
``AWS_REGION`` (which ECS, Lambda and the AWS docs set), so a client made without a region on a host with only
``AWS_REGION`` fails with ``NoRegionError`` on its first call: hence :func:`aws_session`, the one way the bot makes
an AWS session (the provider's clients, the SQS consumer), with the region found here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import aioboto3  # type: ignore[import-untyped]
import botocore.session
from aiobotocore.session import get_session
from botocore.loaders import Loader

NO_REGION_FIX = "set aws.region in FINETUNE_CONFIG, or AWS_REGION"


@dataclass(frozen=True, slots=True)
class Region:
    """A region and where it was found (``aws.region``, ``AWS_REGION``, …), for the check's line."""

    name: str
    source: str


# The variables a region is read from, in order (the help of every command lists them: bot/cli_help.py).
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")


def find_region(configured: str | None = None, environ: Mapping[str, str] | None = None) -> Region | None:
    """The region, in the order of the module docstring; None when none is set anywhere."""
    env = os.environ if environ is None else environ
    if configured:
        return Region(configured, "aws.region")
    for name in REGION_VARIABLES:
        value = (env.get(name) or "").strip()
        if value:
            return Region(value, name)
    profile = botocore.session.Session().get_config_variable("region")  # the profile in ~/.aws/config
    return Region(str(profile), "the AWS profile") if profile else None


def region_name(configured: str | None = None) -> str | None:
    """:func:`find_region`'s name, or None (botocore then raises NoRegionError on the first call)."""
    found = find_region(configured)
    return found.name if found else None


def aws_session(configured: str | None = None) -> aioboto3.Session:
    """The session every AWS client of the bot is opened from, in the region :func:`find_region` says; its service
    models read through the process's one loader (:func:`service_models`)."""
    core = get_session()
    session = aioboto3.Session(region_name=region_name(configured), botocore_session=core)
    core.register_component("data_loader", service_models())
    return session


@functools.cache
def service_models() -> Loader:
    """botocore's loader of the service models (the JSON that describes each API, EC2's alone megabytes), one for
    the process: a session made later (the SQS consumer's, a provider opened again) parses a model once, not once
    more each (0.1-0.3 s of CPU per client). Made as every session's would be, boto3's own data path included."""
    core = get_session()
    aioboto3.Session(botocore_session=core)
    loader: Loader = core.get_component("data_loader")
    return loader
