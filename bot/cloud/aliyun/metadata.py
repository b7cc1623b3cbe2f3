"""The bot's own instance in the hardened metadata mode, switched on by its boot script before anything else runs.

The bot launches every runner hardened (``HttpTokens=required`` in RunInstances and in the scaling configuration it
modifies), but the bot stack's own scaling configuration cannot ask for it: ROS's ``ALIYUN::ESS::ScalingConfiguration``
has no metadata-mode property. So the boot script asks ECS (``ModifyInstanceMetadataOptions``, which the bot's role
may call on instances tagged ``finetune:role=bot`` only) to switch its own instance, and stops if ECS says no:

    python -m bot.cloud.aliyun.metadata --region cn-hangzhou harden

Why it matters for the bot: in the normal mode one plain GET reads the role's credentials, so a request forged through
any of the bot's outbound HTTP paths would hand them out; in the hardened mode every read needs a token from a PUT
with a header first. The instance id is read the hardened way already (a token, then the read), as is every later
credential read (``ALIBABA_CLOUD_IMDSV1_DISABLED=true`` for the SDK). Alibaba Cloud documents no usable hop limit
(``HttpPutResponseHopLimit`` is listed as "not available" in RunInstances and ModifyInstanceMetadataOptions).

Credentials: as ``bot.cloud.aliyun.secrets`` (the test's key pair, else the instance's RAM role). The metadata service:
``ALIBABA_CLOUD_METADATA_ENDPOINT`` (default ``http://100.100.100.200``). Exit 0 when ECS took it, 1 with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from collections.abc import Sequence

from alibabacloud_tea_openapi.client import Client as OpenApiClient
from alibabacloud_tea_openapi.utils_models import OpenApiRequest
from darabonba.runtime import RuntimeOptions

from bot.cloud.aliyun.errors import cloud_errors
from bot.cloud.aliyun.rpc import rpc_params
from bot.cloud.aliyun.secrets import ATTEMPTS, CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS, boot_config
from bot.errors import CloudError, CloudRefused, CloudUnavailable

ECS_VERSION = "2014-05-26"
DEFAULT_METADATA_ENDPOINT = "http://100.100.100.200"
TOKEN_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
HARDENED = {"HttpEndpoint": "enabled", "HttpTokens": "required"}


def own_instance_id(endpoint: str) -> str:
    """This instance's id, read with a session token (as every read must be once the mode is on)."""
    base = endpoint.rstrip("/")
    put = urllib.request.Request(f"{base}/latest/api/token", method="PUT", headers={TOKEN_TTL_HEADER: "60"})
    try:
        with urllib.request.urlopen(put, timeout=5) as reply:
            token = reply.read().decode().strip()
        get = urllib.request.Request(f"{base}/latest/meta-data/instance-id", headers={TOKEN_HEADER: token})
        with urllib.request.urlopen(get, timeout=5) as reply:
            return str(reply.read().decode().strip())
    except OSError as exc:
        raise CloudError(f"the metadata service did not give this instance's id: {exc}") from None


def harden(region: str, instance_id: str, endpoint: str | None = None, pause: float = 2.0) -> None:
    """``ModifyInstanceMetadataOptions`` to the hardened mode; CloudError when ECS refuses or stays silent."""
    client = OpenApiClient(boot_config(region, endpoint or f"ecs.{region}.aliyuncs.com"))
    runtime = RuntimeOptions(autoretry=False, connect_timeout=CONNECT_TIMEOUT_MS, read_timeout=READ_TIMEOUT_MS)
    params = rpc_params("ModifyInstanceMetadataOptions", ECS_VERSION)
    request = OpenApiRequest(query={"RegionId": region, "InstanceId": instance_id, **HARDENED})
    for attempt in range(ATTEMPTS):
        try:
            with cloud_errors("ModifyInstanceMetadataOptions", "ECS"):
                client.call_api(params, request, runtime)
            return
        except CloudRefused as exc:
            raise CloudError(f"ECS refused to harden {instance_id}'s metadata: {exc.code}") from None
        except CloudUnavailable as exc:  # not answered yet while the instance boots: again, a few times
            if attempt == ATTEMPTS - 1:
                raise CloudError(f"ECS did not answer for {instance_id}: {type(exc.__cause__).__name__}") from None
            time.sleep(pause * 2**attempt)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bot.cloud.aliyun.metadata", description=__doc__.splitlines()[0])
    parser.add_argument("--region", required=True)
    parser.add_argument("--endpoint", help="ECS endpoint (default ecs.<region>.aliyuncs.com)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("harden", help="switch this instance to the hardened metadata mode (HttpTokens=required)")
    args = parser.parse_args(argv)
    try:
        instance_id = own_instance_id(os.environ.get("ALIBABA_CLOUD_METADATA_ENDPOINT") or DEFAULT_METADATA_ENDPOINT)
        harden(args.region, instance_id, args.endpoint)
    except (CloudError, ValueError) as exc:
        print(f"finetune: {exc}", file=sys.stderr)
        return 1
    print(f"finetune: {instance_id} reads its metadata in the hardened mode only (HttpTokens=required)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
