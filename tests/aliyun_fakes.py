"""A local Alibaba Cloud OpenAPI endpoint for ECS (2014-05-26) and Auto Scaling (ESS, 2022-02-22).

The official SDKs speak RPC style to it: ``POST /?<parameters>`` with ``x-acs-action`` / ``x-acs-version`` headers,
signed with ACS3-HMAC-SHA256. The fake checks that signature with the test's key pair, exactly as the real endpoint
does (so the provider's credentials really travel), records every call, and keeps just enough state to behave:

- ECS, one region per fake (as ECS's endpoints are regional: a multi-region test starts one fake per region): a
  request naming another ``RegionId`` is refused (``InvalidRegionId.NotFound``), and instances, stock and prices are
  this region's alone. DescribeRegions (``regions``); RunInstances (with ClientToken idempotency; ``DryRun=true``
  answers ``DryRunOperation`` once the request would pass, as ECS does, and starts nothing), DescribeInstances,
  DeleteInstance, DescribeSpotPriceHistory,
  DescribePrice, ModifyInstanceMetadataOptions (kept in the instance's ``metadata_options``); ``no_stock`` zones
  answer ``OperationDenied.NoStock`` as ECS does, ``unsupported`` (zone, type) pairs
  ``InvalidResourceType.NotSupported``;
- ECS deployment sets: CreateDeploymentSet (ClientToken idempotency), DescribeDeploymentSets (by name or ids),
  DeleteDeploymentSet (refused while a live instance is in it); RunInstances with a DeploymentSetId that does not
  exist is refused, one that does records the instance in it;
- KMS Secrets Manager: GetSecretValue over ``secrets``;
- STS: AssumeRole of any role in ``roles`` (each token it issues kept in ``assumed``, with the inline ``Policy`` it
  received, parsed), or ``NoPermission`` for another role;
- ESS: DescribeScalingGroups / Configurations / Instances / Activities, ModifyScalingGroup, ModifyScalingConfiguration;
  a group reconciles its instances with its desired capacity at once, trying its vSwitches in order (the PRIORITY
  multi-zone policy), so sold-out zones are skipped and a sold-out region leaves a failed scaling activity. A group
  instance that is deleted is replaced while the desired capacity says so, as ESS does after a reclaim.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, quote

from aiohttp import web

ACCESS_KEY_ID = "LTAI-test-key-id"
ACCESS_KEY_SECRET = "test-key-secret"
ECS_VERSION = "2014-05-26"
ESS_VERSION = "2022-02-22"
KMS_VERSION = "2016-01-20"
STS_VERSION = "2015-04-01"
SERVICES = {ECS_VERSION: "ecs", ESS_VERSION: "ess", KMS_VERSION: "kms", STS_VERSION: "sts"}


@dataclass
class FakeToken:
    """One STS token the fake issued, and what it was asked for."""

    role_arn: str
    session_name: str
    policy: dict[str, Any]
    seconds: int
    access_key_id: str
    access_key_secret: str
    security_token: str
    expiration: datetime


@dataclass
class FakeInstance:
    instance_id: str
    zone: str
    instance_type: str
    vswitch: str
    spot_strategy: str
    tags: dict[str, str]
    user_data: str
    name: str
    params: dict[str, str]
    group_id: str | None = None
    status: str = "Running"
    metadata_options: dict[str, str] = field(default_factory=dict)
    private_ip: str = ""
    address_hidden_for: int = 0  # DescribeInstances answers naming no address yet (ECS assigns it while Pending)


@dataclass
class FakeConfiguration:
    configuration_id: str
    group_id: str
    instance_types: list[str]
    spot_strategy: str = "SpotAsPriceGo"
    spot_price_limits: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    user_data: str = ""
    name: str = ""


@dataclass
class FakeGroup:
    group_id: str
    vswitches: list[str]
    configuration_id: str
    desired: int = 0
    min_size: int = 0
    max_size: int = 1
    instances: list[str] = field(default_factory=list)
    activities: list[dict[str, Any]] = field(default_factory=list)
    state: str = "Active"


@dataclass
class FakeDeploymentSet:
    set_id: str
    name: str
    strategy: str
    description: str
    instances: list[str] = field(default_factory=list)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


def indexed(params: dict[str, str], name: str) -> list[str]:
    """``Name.1``, ``Name.2``… in order (how the SDK flattens a list)."""
    found = sorted(
        (int(key[len(name) + 1 :]), value)
        for key, value in params.items()
        if key.startswith(name + ".") and key[len(name) + 1 :].isdigit()
    )
    return [value for _, value in found]


def indexed_objects(params: dict[str, str], name: str) -> list[dict[str, str]]:
    """``Name.1.Key``, ``Name.1.Value``… as a list of dicts."""
    objects: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == name and parts[1].isdigit():
            objects.setdefault(int(parts[1]), {})[parts[2]] = value
    return [objects[index] for index in sorted(objects)]


def acs3_signature(
    secret: str,
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    signed: list[str],
    payload_hash: str,
) -> str:
    """ACS3-HMAC-SHA256 as Alibaba's signature v3 documentation defines it."""
    canonical_query = "&".join(f"{key}={quote(value, safe='~')}" for key, value in sorted(query))
    canonical_headers = "".join(f"{name}:{headers[name].strip()}\n" for name in signed)
    canonical = f"{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{';'.join(signed)}\n{payload_hash}"
    to_sign = "ACS3-HMAC-SHA256\n" + hashlib.sha256(canonical.encode()).hexdigest()
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()


class FakeAliyun:
    """Handlers are named `_<service>_<Action>` after the API (see the module docstring)."""

    def __init__(self, region: str = "cn-hangzhou") -> None:
        self.region = region
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.rejected: list[str] = []  # why a request was refused before reaching an action
        self.no_stock: set[str] = set()  # zones without capacity
        self.run_fault: Callable[[dict[str, str]], str | None] | None = None  # RunInstances error code, or None
        self.unsupported: set[tuple[str, str]] = set()  # (zone, type) pairs not offered
        self.spot_prices: dict[tuple[str, str], float] = {}
        self.on_demand_prices: dict[str, float] = {}
        self.fail_price_history = False
        self.stock: dict[
            str, str
        ] = {}  # zone -> DescribeAvailableResource's StatusCategory (none listed: empty answer)
        self.instances: dict[str, FakeInstance] = {}
        self.address_delay = 0  # each new instance's private address is named from its n+1-th description on
        self.deleted: list[str] = []
        self.vswitch_zones: dict[str, str] = {}
        self.groups: dict[str, FakeGroup] = {}
        self.configurations: dict[str, FakeConfiguration] = {}
        self.deployment_sets: dict[str, FakeDeploymentSet] = {}
        self.deployment_sets_refused = False  # CreateDeploymentSet answers Forbidden.RAM, as for a bot without it
        self.secrets: dict[str, str] = {}  # KMS Secrets Manager: name -> the current version's value
        self.roles: set[str] = set()  # STS: the role ARNs the caller may assume
        self.regions = [region, "cn-shanghai", "cn-beijing"]  # what DescribeRegions lists
        self.assumed: list[FakeToken] = []
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)
        self._tokens: dict[str, str] = {}
        self._numbers = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def actions(self, action: str) -> list[dict[str, str]]:
        return [params for name, params in self.calls if name == action]

    def add_group(self, vswitches: list[str], instance_types: list[str]) -> FakeGroup:
        number = next(self._numbers)
        configuration = FakeConfiguration(f"asc-{number:06d}", f"asg-{number:06d}", list(instance_types))
        group = FakeGroup(configuration.group_id, list(vswitches), configuration.configuration_id)
        self.configurations[configuration.configuration_id] = configuration
        self.groups[group.group_id] = group
        return group

    def live(self) -> list[FakeInstance]:
        return [instance for instance in self.instances.values() if instance.status != "Deleted"]

    async def start(self) -> FakeAliyun:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- the wire -------------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        request_id = str(uuid.uuid4()).upper()
        try:
            self._verify(request, body)
            query = parse_qsl(request.query_string, keep_blank_values=True)
            params = dict(query)
            if body and request.content_type == "application/x-www-form-urlencoded":
                params.update(parse_qsl(body.decode(), keep_blank_values=True))
            action = request.headers.get("x-acs-action") or params.get("Action", "")
            version = request.headers.get("x-acs-version") or params.get("Version", "")
            self.calls.append((action, params))
            service = SERVICES.get(version, "none")
            handler = getattr(self, f"_{service}_{action}", None)
            if handler is None:
                raise ApiError(400, "InvalidAction.NotFound", f"{action} {version} is not supported here")
            if service == "ecs" and params.get("RegionId", self.region) != self.region:
                self.rejected.append(f"region {params['RegionId']}")
                raise ApiError(404, "InvalidRegionId.NotFound", f"this endpoint serves {self.region} only")
            answer: dict[str, Any] = handler(params)
        except ApiError as exc:
            payload = {"RequestId": request_id, "Code": exc.code, "Message": exc.message, "HostId": request.host}
            return web.json_response(payload, status=exc.status)
        return web.json_response({"RequestId": request_id, **answer})

    def _verify(self, request: web.Request, body: bytes) -> None:
        authorization = request.headers.get("Authorization", "")
        algorithm, _, rest = authorization.partition(" ")
        fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
        if algorithm != "ACS3-HMAC-SHA256" or not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
            self.rejected.append("unsigned")
            raise ApiError(400, "MissingAuthorization", "the request is not signed with ACS3-HMAC-SHA256")
        if fields["Credential"] != ACCESS_KEY_ID:
            self.rejected.append("unknown key")
            raise ApiError(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        payload_hash = hashlib.sha256(body).hexdigest()
        if request.headers.get("x-acs-content-sha256") != payload_hash:
            self.rejected.append("payload hash")
            raise ApiError(400, "IncompleteSignature", "x-acs-content-sha256 does not match the body")
        signed = fields["SignedHeaders"].split(";")
        headers = {name: ",".join(sorted(request.headers.getall(name, []))) for name in signed}
        query = parse_qsl(request.query_string, keep_blank_values=True)
        expected = acs3_signature(ACCESS_KEY_SECRET, request.method, request.path, query, headers, signed, payload_hash)
        if not hmac.compare_digest(expected, fields["Signature"]):
            self.rejected.append("signature")
            raise ApiError(400, "SignatureDoesNotMatch", "The request signature does not conform to Aliyun standards.")

    # -- KMS Secrets Manager --------------------------------------------------------------------------------

    def _kms_GetSecretValue(self, params: dict[str, str]) -> dict[str, Any]:
        name = params.get("SecretName", "")
        if name not in self.secrets:
            raise ApiError(404, "Forbidden.ResourceNotFound", f"The secret {name} does not exist.")
        return {"SecretName": name, "SecretData": self.secrets[name], "SecretDataType": "text", "VersionId": "v1"}

    # -- STS ------------------------------------------------------------------------------------------------

    def _sts_AssumeRole(self, params: dict[str, str]) -> dict[str, Any]:
        role = params.get("RoleArn", "")
        if role not in self.roles:
            raise ApiError(403, "NoPermission", f"You are not authorized to assume the role {role}.")
        seconds = int(params.get("DurationSeconds") or 3600)
        if not 900 <= seconds <= 3600:
            raise ApiError(400, "InvalidParameter.DurationSeconds", "DurationSeconds is out of range.")
        name = params.get("RoleSessionName", "")
        if not 2 <= len(name) <= 64:
            raise ApiError(400, "InvalidParameter.RoleSessionName", "RoleSessionName is invalid.")
        token = FakeToken(
            role_arn=role,
            session_name=name,
            policy=json.loads(params["Policy"]) if params.get("Policy") else {},
            seconds=seconds,
            access_key_id="STS." + secrets.token_hex(12),
            access_key_secret=secrets.token_urlsafe(30),
            security_token="CAIS" + secrets.token_urlsafe(300),
            expiration=(self.now() + timedelta(seconds=seconds)).replace(microsecond=0),
        )
        self.assumed.append(token)
        return {
            "Credentials": {
                "AccessKeyId": token.access_key_id,
                "AccessKeySecret": token.access_key_secret,
                "SecurityToken": token.security_token,
                "Expiration": token.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "AssumedRoleUser": {"Arn": f"{role}/{name}", "AssumedRoleId": f"3{len(self.assumed):017d}:{name}"},
        }

    # -- ECS ------------------------------------------------------------------------------------------------

    def _ecs_RunInstances(self, params: dict[str, str]) -> dict[str, Any]:
        for required in ("RegionId", "InstanceType", "ImageId"):
            if not params.get(required):
                raise ApiError(400, "MissingParameter", f"{required} is mandatory for this action.")
        token = params.get("ClientToken")
        if token and token in self._tokens:
            return {"InstanceIdSets": {"InstanceIdSet": [self._tokens[token]]}}
        zone = params.get("ZoneId") or self.vswitch_zones.get(params.get("VSwitchId", ""), "")
        instance_type = params["InstanceType"]
        fault = self.run_fault(params) if self.run_fault is not None else None
        if fault is not None:
            raise ApiError(403, fault, f"{fault} for {instance_type} in {zone}")
        if params.get("DryRun", "").lower() == "true":  # the SDK sends Python's spelling, True
            raise ApiError(400, "DryRunOperation", "Request validation has been passed with DryRun flag set.")
        self._check_capacity(zone, instance_type)
        deployment_set = self._deployment_set_of(params.get("DeploymentSetId", ""))
        tags = {tag["Key"]: tag.get("Value", "") for tag in indexed_objects(params, "Tag")}
        instance = self._create(
            zone,
            instance_type,
            params.get("VSwitchId", ""),
            params.get("SpotStrategy", "NoSpot"),
            tags,
            params.get("UserData", ""),
            params.get("InstanceName", ""),
            params,
        )
        if token:
            self._tokens[token] = instance.instance_id
        if deployment_set is not None:
            deployment_set.instances.append(instance.instance_id)
        return {"InstanceIdSets": {"InstanceIdSet": [instance.instance_id]}, "TradePrice": 0.0}

    def _ecs_DescribeRegions(self, params: dict[str, str]) -> dict[str, Any]:
        return {"Regions": {"Region": [{"RegionId": region, "LocalName": region} for region in self.regions]}}

    def _deployment_set_of(self, set_id: str) -> FakeDeploymentSet | None:
        if not set_id:
            return None
        if set_id not in self.deployment_sets:
            raise ApiError(404, "InvalidDeploymentSetId.NotFound", f"The DeploymentSetId {set_id} does not exist.")
        return self.deployment_sets[set_id]

    def _ecs_CreateDeploymentSet(self, params: dict[str, str]) -> dict[str, Any]:
        if self.deployment_sets_refused:
            raise ApiError(403, "Forbidden.RAM", "User not authorized to operate on the specified resource.")
        token = params.get("ClientToken")
        if token and token in self._tokens:
            return {"DeploymentSetId": self._tokens[token]}
        strategy = params.get("Strategy") or "Availability"
        if strategy not in ("Availability", "AvailabilityGroup", "LowLatency"):
            raise ApiError(400, "InvalidStrategy.Malformed", f"The strategy {strategy} is not valid.")
        name, description = params.get("DeploymentSetName", ""), params.get("Description", "")
        made = FakeDeploymentSet(f"ds-bp{uuid.uuid4().hex[:18]}", name, strategy, description)
        self.deployment_sets[made.set_id] = made
        if token:
            self._tokens[token] = made.set_id
        return {"DeploymentSetId": made.set_id}

    def _ecs_DescribeDeploymentSets(self, params: dict[str, str]) -> dict[str, Any]:
        name = params.get("DeploymentSetName")
        ids = json.loads(params["DeploymentSetIds"]) if params.get("DeploymentSetIds") else None
        items = [
            {
                "DeploymentSetId": found.set_id,
                "DeploymentSetName": found.name,
                "DeploymentStrategy": found.strategy,
                "DeploymentSetDescription": found.description,
                "InstanceAmount": len(self._live_in(found)),
                "InstanceIds": {"InstanceId": self._live_in(found)},
            }
            for found in self.deployment_sets.values()
            if (name is None or found.name == name) and (ids is None or found.set_id in ids)
        ]
        return {"DeploymentSets": {"DeploymentSet": items}, "TotalCount": len(items), "PageNumber": 1, "PageSize": 10}

    def _live_in(self, deployment_set: FakeDeploymentSet) -> list[str]:
        return [i for i in deployment_set.instances if self.instances[i].status != "Deleted"]

    def _ecs_DeleteDeploymentSet(self, params: dict[str, str]) -> dict[str, Any]:
        found = self._deployment_set_of(params.get("DeploymentSetId", ""))
        assert found is not None
        if self._live_in(found):
            raise ApiError(403, "DependencyViolation.Instance", "The deployment set still has instances.")
        del self.deployment_sets[found.set_id]
        return {}

    def _check_capacity(self, zone: str, instance_type: str) -> None:
        if (zone, instance_type) in self.unsupported:
            raise ApiError(
                403,
                "InvalidResourceType.NotSupported",
                f"This resource type {instance_type} is not supported in zone {zone}.",
            )
        if zone in self.no_stock:
            raise ApiError(
                403,
                "OperationDenied.NoStock",
                "The requested resource is sold out in the specified zone; try other types of resources "
                "or other regions and zones.",
            )

    def _create(
        self,
        zone: str,
        instance_type: str,
        vswitch: str,
        spot_strategy: str,
        tags: dict[str, str],
        user_data: str,
        name: str,
        params: dict[str, str],
        group_id: str | None = None,
    ) -> FakeInstance:
        instance_id = f"i-bp{uuid.uuid4().hex[:18]}"
        decoded = base64.b64decode(user_data).decode() if user_data else ""
        instance = FakeInstance(
            instance_id, zone, instance_type, vswitch, spot_strategy, tags, decoded, name, dict(params), group_id
        )
        instance.private_ip = f"172.16.{len(self.instances) // 250}.{len(self.instances) % 250 + 2}"
        instance.address_hidden_for = self.address_delay
        self.instances[instance_id] = instance
        return instance

    def add_instance(self, tags: dict[str, str], zone: str = "cn-hangzhou-j") -> FakeInstance:
        """An instance something else launched (the bot's own, from its scaling group)."""
        return self._create(zone, "ecs.g7.large", "", "NoSpot", tags, "", "finetune-bot", {})

    def _ecs_ModifyInstanceMetadataOptions(self, params: dict[str, str]) -> dict[str, Any]:
        instance = self.instances.get(params.get("InstanceId", ""))
        if instance is None or params.get("RegionId") != self.region:
            raise ApiError(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        if params.get("HttpTokens", "optional") not in ("optional", "required"):
            raise ApiError(400, "InvalidHttpTokens.Malformed", "HttpTokens is not valid.")
        options = ("HttpEndpoint", "HttpTokens", "HttpPutResponseHopLimit")
        instance.metadata_options.update({name: params[name] for name in options if name in params})
        return {}

    def _ecs_DescribeInstances(self, params: dict[str, str]) -> dict[str, Any]:
        """By ``InstanceIds``, or every instance carrying the ``Tag.N.Key`` (and ``Tag.N.Value``) filters, a page
        of ``PageSize`` at ``PageNumber``, as ECS pages them; released instances are not listed."""
        live = {i: instance for i, instance in self.instances.items() if instance.status != "Deleted"}
        if "InstanceIds" in params:
            found = [live[i] for i in json.loads(params["InstanceIds"]) if i in live]
        else:
            filters = indexed_objects(params, "Tag")
            found = [
                instance
                for instance in live.values()
                if all(
                    f["Key"] in instance.tags and f.get("Value", instance.tags[f["Key"]]) == instance.tags[f["Key"]]
                    for f in filters
                )
            ]
        total = len(found)
        number, size = int(params.get("PageNumber", "1")), int(params.get("PageSize", "10"))
        found = found[(number - 1) * size : number * size]
        items = [
            {
                "InstanceId": instance.instance_id,
                "InstanceType": instance.instance_type,
                "ZoneId": instance.zone,
                "Status": instance.status,
                "SpotStrategy": instance.spot_strategy,
                "InstanceName": instance.name,
                "VpcAttributes": {
                    "VSwitchId": instance.vswitch,
                    "PrivateIpAddress": {"IpAddress": self._address_of(instance)},
                },
                "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in instance.tags.items()]},
            }
            for instance in found
        ]
        return {"Instances": {"Instance": items}, "TotalCount": total, "PageNumber": number, "PageSize": size}

    def _address_of(self, instance: FakeInstance) -> list[str]:
        """The instance's private address as DescribeInstances lists it: none while it is still being assigned."""
        if instance.address_hidden_for > 0:
            instance.address_hidden_for -= 1
            return []
        return [instance.private_ip]

    def _ecs_DeleteInstance(self, params: dict[str, str]) -> dict[str, Any]:
        instance = self.instances.get(params.get("InstanceId", ""))
        if instance is None or instance.status == "Deleted":
            raise ApiError(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        if instance.status == "Running" and params.get("Force", "").lower() != "true":
            raise ApiError(
                403, "IncorrectInstanceStatus", "The current status of the resource does not support this operation."
            )
        self._release(instance)
        group = self.groups.get(instance.group_id or "")
        if group is not None:
            self._reconcile(group)  # ESS replaces an instance that is gone while the desired capacity says so
        return {}

    def _release(self, instance: FakeInstance) -> None:
        instance.status = "Deleted"
        self.deleted.append(instance.instance_id)
        group = self.groups.get(instance.group_id or "")
        if group is not None and instance.instance_id in group.instances:
            group.instances.remove(instance.instance_id)

    def _ecs_DescribeSpotPriceHistory(self, params: dict[str, str]) -> dict[str, Any]:
        if self.fail_price_history:
            raise ApiError(503, "ServiceUnavailable", "The request has failed due to a temporary failure.")
        for required in ("RegionId", "InstanceType", "NetworkType"):
            if not params.get(required):
                raise ApiError(400, "MissingParameter", f"{required} is mandatory for this action.")
        instance_type = params["InstanceType"]
        items = [
            {
                "ZoneId": zone,
                "InstanceType": kind,
                "IoOptimized": "optimized",
                "NetworkType": "vpc",
                "SpotPrice": price,
                "OriginPrice": self.on_demand_prices.get(kind, price * 4),
                "Timestamp": "2026-01-01T00:00:00Z",
            }
            for (zone, kind), price in self.spot_prices.items()
            if kind == instance_type and params.get("ZoneId") in (None, zone)
        ]
        return {"SpotPrices": {"SpotPriceType": items}, "NextOffset": 0, "Currency": "CNY"}

    def _ecs_DescribeAvailableResource(self, params: dict[str, str]) -> dict[str, Any]:
        for required in ("RegionId", "DestinationResource"):
            if not params.get(required):
                raise ApiError(400, "MissingParameter", f"{required} is mandatory for this action.")
        instance_type = params.get("InstanceType", "")
        zones = [
            {
                "ZoneId": zone,
                "RegionId": self.region,
                "Status": "Available" if "WithStock" in status else "SoldOut",
                "StatusCategory": status,
                "AvailableResources": {
                    "AvailableResource": [
                        {
                            "Type": "InstanceType",
                            "SupportedResources": {
                                "SupportedResource": [
                                    {"Value": instance_type, "Status": "Available", "StatusCategory": status}
                                ]
                            },
                        }
                    ]
                },
            }
            for zone, status in self.stock.items()
            if (zone, instance_type) not in self.unsupported
        ]
        return {"AvailableZones": {"AvailableZone": zones}}

    def _ecs_DescribePrice(self, params: dict[str, str]) -> dict[str, Any]:
        price = self.on_demand_prices.get(params.get("InstanceType", ""))
        if price is None:
            raise ApiError(400, "InvalidInstanceType.ValueNotSupported", "The specified InstanceType is not valid.")
        return {
            "PriceInfo": {
                "Price": {"OriginalPrice": price, "DiscountPrice": 0.0, "TradePrice": price, "Currency": "CNY"},
                "Rules": {"Rule": []},
            }
        }

    # -- ESS ------------------------------------------------------------------------------------------------

    def _group(self, params: dict[str, str]) -> FakeGroup:
        group = self.groups.get(params.get("ScalingGroupId", ""))
        if group is None:
            raise ApiError(404, "InvalidScalingGroupId.NotFound", "The specified scaling group does not exist.")
        return group

    def _ess_DescribeScalingGroups(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = indexed(params, "ScalingGroupIds") or list(self.groups)
        items = [
            {
                "ScalingGroupId": group.group_id,
                "ScalingGroupName": f"finetune-{group.group_id}",
                "LifecycleState": group.state,
                "ActiveScalingConfigurationId": group.configuration_id,
                "DesiredCapacity": group.desired,
                "MinSize": group.min_size,
                "MaxSize": group.max_size,
                "TotalCapacity": len(group.instances),
                "VSwitchIds": list(group.vswitches),
                "MultiAZPolicy": "PRIORITY",
                "RegionId": self.region,
            }
            for group_id in wanted
            if (group := self.groups.get(group_id)) is not None
        ]
        return {"ScalingGroups": items, "TotalCount": len(items), "PageNumber": 1, "PageSize": 10}

    def _ess_DescribeScalingConfigurations(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        wanted = indexed(params, "ScalingConfigurationIds") or [group.configuration_id]
        items = [
            {
                "ScalingConfigurationId": configuration.configuration_id,
                "ScalingGroupId": configuration.group_id,
                "InstanceTypes": list(configuration.instance_types),
                "SpotStrategy": configuration.spot_strategy,
                "SpotPriceLimits": [
                    {"InstanceType": t, "PriceLimit": p} for t, p in configuration.spot_price_limits.items()
                ],
                "Tags": [{"Key": k, "Value": v} for k, v in configuration.tags.items()],
                "UserData": base64.b64encode(configuration.user_data.encode()).decode(),
                "LifecycleState": "Active",
            }
            for configuration_id in wanted
            if (configuration := self.configurations.get(configuration_id)) is not None
        ]
        return {"ScalingConfigurations": items, "TotalCount": len(items), "PageNumber": 1, "PageSize": 10}

    def _ess_ModifyScalingConfiguration(self, params: dict[str, str]) -> dict[str, Any]:
        configuration = self.configurations.get(params.get("ScalingConfigurationId", ""))
        if configuration is None:
            raise ApiError(404, "InvalidScalingConfigurationId.NotFound", "The scaling configuration does not exist.")
        if "UserData" in params:
            configuration.user_data = base64.b64decode(params["UserData"]).decode()
        if "Tags" in params:
            configuration.tags = {str(k): str(v) for k, v in json.loads(params["Tags"]).items()}
        if indexed(params, "InstanceTypes"):
            configuration.instance_types = indexed(params, "InstanceTypes")
        if "SpotStrategy" in params:
            configuration.spot_strategy = params["SpotStrategy"]
        limits = indexed_objects(params, "SpotPriceLimits")
        configuration.spot_price_limits = {item["InstanceType"]: float(item["PriceLimit"]) for item in limits}
        configuration.name = params.get("InstanceName", configuration.name)
        return {}

    def _ess_ModifyScalingGroup(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        if indexed(params, "VSwitchIds"):
            group.vswitches = indexed(params, "VSwitchIds")
        for name, attribute in (("MinSize", "min_size"), ("MaxSize", "max_size"), ("DesiredCapacity", "desired")):
            if name in params:
                setattr(group, attribute, int(params[name]))
        if not group.min_size <= group.desired <= group.max_size:
            raise ApiError(
                400,
                "IncorrectCapacity.DesiredCapacity",
                "The desired capacity must be between the minimum and the maximum size.",
            )
        self._reconcile(group)
        return {}

    def _reconcile(self, group: FakeGroup) -> None:
        while len(group.instances) > group.desired:
            self._release(self.instances[group.instances[-1]])
            group.activities.insert(0, {"StatusCode": "Successful", "Description": "Remove 1 ECS instance"})
        while len(group.instances) < group.desired:
            if not self._scale_out(group):
                break

    def _scale_out(self, group: FakeGroup) -> bool:
        configuration = self.configurations[group.configuration_id]
        errors: list[str] = []
        for vswitch in group.vswitches:
            zone = self.vswitch_zones.get(vswitch, "")
            for instance_type in configuration.instance_types:
                try:
                    self._check_capacity(zone, instance_type)
                except ApiError as exc:
                    errors.append(f"{zone} {instance_type}: {exc.code}")
                    continue
                instance = self._create(
                    zone,
                    instance_type,
                    vswitch,
                    configuration.spot_strategy,
                    dict(configuration.tags),
                    base64.b64encode(configuration.user_data.encode()).decode(),
                    configuration.name,
                    {},
                    group.group_id,
                )
                group.instances.append(instance.instance_id)
                group.activities.insert(0, {"StatusCode": "Successful", "Description": "Add 1 ECS instance"})
                return True
        message = '"OperationDenied.NoStock": the requested resource is sold out (' + "; ".join(errors) + ")"
        group.activities.insert(
            0, {"StatusCode": "Failed", "StatusMessage": message, "Description": "Add 1 ECS instance"}
        )
        return False

    def _ess_DescribeScalingInstances(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        wanted = set(indexed(params, "InstanceIds"))
        items = [
            {
                "InstanceId": instance_id,
                "ZoneId": self.instances[instance_id].zone,
                "LifecycleState": "InService",
                "HealthStatus": "Healthy",
                "CreationType": "AutoCreated",
                "ScalingGroupId": group.group_id,
                "ScalingConfigurationId": group.configuration_id,
                "SpotStrategy": self.instances[instance_id].spot_strategy,
            }
            for instance_id in group.instances
            if not wanted or instance_id in wanted
        ]
        return {"ScalingInstances": items, "TotalCount": len(items), "PageNumber": 1, "PageSize": 50}

    def _ess_DescribeScalingActivities(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        return {"ScalingActivities": list(group.activities), "TotalCount": len(group.activities)}
