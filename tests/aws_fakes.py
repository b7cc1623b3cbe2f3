"""What moto does not do for the AWS provider's tests, supplied explicitly at the wire level.

``Ec2Proxy`` sits in front of moto for the clients the test points at it (``AWS_ENDPOINT_URL_EC2``,
``AWS_ENDPOINT_URL_FIS``) and forwards everything unchanged except what a test asks it to fake:

- RunInstances answered with EC2's real capacity error (HTTP 500 + EC2 error XML) for chosen requests,
  since moto never runs out of capacity;
- GetSpotPlacementScores answered with chosen scores (moto does not implement it: it answers HTTP 500), for one
  region or, as EC2 does for ``RegionNames``, for each region asked;
- DescribeSpotPriceHistory answered with chosen prices (moto's are one constant), those of the asking region's zones;
- FIS answered with AccessDeniedException, as for a bot without the FIS permissions;
- placement groups (moto 5.2.5 has none): CreatePlacementGroup / DeletePlacementGroup / DescribePlacementGroups
  on the proxy's own record, with EC2's error codes, and RunInstances naming an unknown group refused as EC2 does.

``deliver_fis_interruption`` plays EC2's part of a started FIS experiment (moto only records experiments):
it resolves the template's tag target against the instances and reclaims the matching spot instances.

Every EC2 query request is recorded with the region it was signed for (moto reads the region the same way) under the
form key ``@region``, so a fault can answer one region and not another.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"

RunInstancesFault = Callable[[dict[str, str]], str | None]


def ec2_error(code: str, message: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    )


REGION_FORM_KEY = "@region"  # the region an EC2 request was signed for, added to its recorded form
_SIGNED_REGION = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[a-z0-9-]+)/")
_ZONE_REGION = re.compile(r"^(?P<region>.+\d)[a-z]$")


def signed_region(authorization: str) -> str:
    """The region a SigV4 ``Authorization`` header was signed for (empty when it names none)."""
    found = _SIGNED_REGION.search(authorization)
    return found.group("region") if found else ""


def placement_scores_xml(scores: dict[str, int], region: str = "us-east-1") -> str:
    return placement_scores_by_region_xml({region: scores})


def placement_scores_by_region_xml(scores: dict[str, dict[str, int]]) -> str:
    items = "".join(
        f"<item><region>{region}</region><availabilityZoneId>{zone_id}</availabilityZoneId>"
        f"<score>{score}</score></item>"
        for region, by_zone in scores.items()
        for zone_id, score in by_zone.items()
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<GetSpotPlacementScoresResponse xmlns="{EC2_XMLNS}">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPlacementScoreSet>{items}</spotPlacementScoreSet>"
        "</GetSpotPlacementScoresResponse>"
    )


def spot_prices_xml(prices: dict[tuple[str, str], float]) -> str:
    items = "".join(
        f"<item><instanceType>{instance_type}</instanceType><productDescription>Linux/UNIX</productDescription>"
        f"<spotPrice>{price}</spotPrice><timestamp>2025-01-01T00:00:00.000Z</timestamp>"
        f"<availabilityZone>{zone}</availabilityZone></item>"
        for (zone, instance_type), price in prices.items()
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeSpotPriceHistoryResponse xmlns="{EC2_XMLNS}">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPriceHistorySet>{items}</spotPriceHistorySet>"
        "<nextToken/></DescribeSpotPriceHistoryResponse>"
    )


def placement_group_xml(name: str, group: PlacementGroup) -> str:
    tags = "".join(f"<item><key>{key}</key><value>{value}</value></item>" for key, value in group.tags.items())
    return (
        f"<groupName>{name}</groupName><strategy>{group.strategy}</strategy><state>available</state>"
        f"<groupId>pg-{abs(hash(name)) % 10**12:012d}</groupId><tagSet>{tags}</tagSet>"
    )


@dataclass
class PlacementGroup:
    strategy: str
    tags: dict[str, str]


def _tags_of_form(form: dict[str, str], resource_type: str) -> dict[str, str]:
    """The tags a query request's ``TagSpecification.N`` of ``resource_type`` carries."""
    tags: dict[str, str] = {}
    for key, value in form.items():
        if key.startswith("TagSpecification.") and key.endswith(".ResourceType") and value == resource_type:
            spec = key.removesuffix(".ResourceType")
            index = 1
            while f"{spec}.Tag.{index}.Key" in form:
                tags[form[f"{spec}.Tag.{index}.Key"]] = form.get(f"{spec}.Tag.{index}.Value", "")
                index += 1
    return tags


class Ec2Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.run_instances_fault: RunInstancesFault | None = None
        self.placement_scores: dict[str, int] | None = None  # zone id -> score; None: moto's own answer
        # region -> zone id -> score, answered for the regions a request names (RegionNames); None: not faked
        self.regional_placement_scores: dict[str, dict[str, int]] | None = None
        self.spot_prices: dict[tuple[str, str], float] | None = None
        self.deny_fis = False
        self.denied_actions: set[str] = set()  # EC2 actions refused with UnauthorizedOperation
        self.calls: list[tuple[str, dict[str, str]]] = []  # (EC2 Action, form) of every EC2 query request
        self.placement_groups: dict[str, PlacementGroup] = {}  # name -> group, as EC2 would hold them
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def actions(self, action: str) -> list[dict[str, str]]:
        return [form for name, form in self.calls if name == action]

    async def start(self) -> Ec2Proxy:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._client = aiohttp.ClientSession(auto_decompress=False)
        return self

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path.startswith(("/experimentTemplates", "/experiments")) and self.deny_fis:
            payload = {"__type": "AccessDeniedException", "message": "User is not authorized to perform fis:*"}
            return web.json_response(payload, status=403, headers={"x-amzn-ErrorType": "AccessDeniedException"})
        form: dict[str, str] = {}
        if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
            form = dict(parse_qsl(body.decode(), keep_blank_values=True))
        action = form.get("Action", "")
        if action:
            form[REGION_FORM_KEY] = signed_region(request.headers.get("Authorization", ""))
            self.calls.append((action, form))
        if action == "RunInstances" and self.run_instances_fault is not None:
            code = self.run_instances_fault(form)
            if code is not None:
                zone = form.get("Placement.AvailabilityZone", "?")
                message = f"We currently do not have sufficient {form.get('InstanceType')} capacity in {zone}."
                return web.Response(status=500, text=ec2_error(code, message), content_type="text/xml")
        if action in self.denied_actions:
            message = f"You are not authorized to perform this operation ({action})."
            return web.Response(status=403, text=ec2_error("UnauthorizedOperation", message), content_type="text/xml")
        if action in ("CreatePlacementGroup", "DeletePlacementGroup", "DescribePlacementGroups"):
            return self._placement_group(action, form)
        group = form.get("Placement.GroupName")
        if action == "RunInstances" and group and group not in self.placement_groups:
            message = f"The Placement Group '{group}' is unknown."
            return web.Response(
                status=400, text=ec2_error("InvalidPlacementGroup.Unknown", message), content_type="text/xml"
            )
        if action == "GetSpotPlacementScores" and self.regional_placement_scores is not None:
            asked = [value for key, value in form.items() if key.startswith("RegionName.")]
            scores = {region: self.regional_placement_scores.get(region, {}) for region in asked}
            return web.Response(text=placement_scores_by_region_xml(scores), content_type="text/xml")
        if action == "GetSpotPlacementScores" and self.placement_scores is not None:
            return web.Response(text=placement_scores_xml(self.placement_scores), content_type="text/xml")
        if action == "DescribeSpotPriceHistory" and self.spot_prices is not None:
            region = form[REGION_FORM_KEY]
            here = {
                key: price for key, price in self.spot_prices.items() if not region or _zone_region(key[0]) == region
            }
            return web.Response(text=spot_prices_xml(here), content_type="text/xml")
        return await self._forward(request, body)

    def _placement_group(self, action: str, form: dict[str, str]) -> web.Response:
        """EC2's placement groups, which moto lacks: the record, EC2's answers and its error codes."""
        name = form.get("GroupName", "")
        head = f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{EC2_XMLNS}">'
        head += f"<requestId>{uuid.uuid4()}</requestId>"
        tail = f"</{action}Response>"
        if action == "CreatePlacementGroup":
            if name in self.placement_groups:
                message = f"The Placement Group '{name}' already exists."
                error = ec2_error("InvalidPlacementGroup.Duplicate", message)
                return web.Response(status=400, text=error, content_type="text/xml")
            group = PlacementGroup(form.get("Strategy", ""), _tags_of_form(form, "placement-group"))
            self.placement_groups[name] = group
            body = f"<placementGroup>{placement_group_xml(name, group)}</placementGroup>"
            return web.Response(text=head + body + tail, content_type="text/xml")
        if action == "DeletePlacementGroup":
            if self.placement_groups.pop(name, None) is None:
                error = ec2_error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                return web.Response(status=400, text=error, content_type="text/xml")
            return web.Response(text=head + "<return>true</return>" + tail, content_type="text/xml")
        items = "".join(f"<item>{placement_group_xml(n, g)}</item>" for n, g in self.placement_groups.items())
        body = f"<placementGroupSet>{items}</placementGroupSet>"
        return web.Response(text=head + body + tail, content_type="text/xml")

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._client is not None
        headers = {key: value for key, value in request.headers.items() if key.lower() not in _HOP_HEADERS}
        headers["Host"] = request.host
        async with self._client.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as reply:
            payload = await reply.read()
            out_headers = {key: value for key, value in reply.headers.items() if key.lower() not in _HOP_HEADERS}
            return web.Response(status=reply.status, body=payload, headers=out_headers)


def _zone_region(zone: str) -> str:
    found = _ZONE_REGION.fullmatch(zone)
    return found.group("region") if found else ""


def spot_request(form: dict[str, str]) -> bool:
    return form.get("InstanceMarketOptions.MarketType") == "spot"


def deliver_fis_interruption(ec2: Any, fis: Any, experiment_id: str) -> list[str]:
    """EC2's side of ``aws:ec2:send-spot-instance-interruptions``, which moto does not perform: select the
    experiment's target (resource type, tags, state filter) among the instances, and reclaim the selected
    spot instances. Returns the reclaimed instance ids."""
    experiment = fis.get_experiment(id=experiment_id)["experiment"]
    template = fis.get_experiment_template(id=experiment["experimentTemplateId"])["experimentTemplate"]
    reclaimed: list[str] = []
    for target in template["targets"].values():
        assert target["resourceType"] == "aws:ec2:spot-instance"
        filters = [{"Name": f"tag:{key}", "Values": [value]} for key, value in target["resourceTags"].items()]
        for extra in target.get("filters", []):
            assert extra["path"] == "State.Name"
            filters.append({"Name": "instance-state-name", "Values": list(extra["values"])})
        reservations = ec2.describe_instances(Filters=filters)["Reservations"]
        for reservation in reservations:
            for instance in reservation["Instances"]:
                if instance.get("InstanceLifecycle") == "spot":
                    reclaimed.append(instance["InstanceId"])
    if reclaimed:
        ec2.terminate_instances(InstanceIds=reclaimed)
    return reclaimed
