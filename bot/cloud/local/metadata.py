"""A local instance-metadata service, so a runner on this machine hears spot notices the way it would on a cloud.

It speaks either dialect the runner polls, each in the hardened mode the launches ask for (a session token from
``PUT /latest/api/token`` is required on every read, 401 without it; only the header names differ): AWS IMDSv2
(``spot/instance-action`` and ``events/recommendations/rebalance`` answer 404 until a notice is posted) and
Alibaba ECS with ``HttpTokens=required`` (``instance/spot/termination-time``, and the STS credentials of the
instance's RAM roles under ``ram/security-credentials/``). The local cloud gives each local instance its own
server; tests use it to deliver notices, expire tokens and take the service down.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Literal

from aiohttp import web

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
ALIYUN_TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
ALIYUN_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LocalMetadataServer:
    def __init__(
        self,
        dialect: Literal["aws", "aliyun"] = "aws",
        instance_id: str = "i-0local000000000",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.dialect = dialect
        self.instance_id = instance_id
        self.host = host
        self.port = port
        self.tokens: dict[str, float] = {}
        self.interruption: datetime | None = None
        self.rebalance_at: datetime | None = None
        self.ram_roles: dict[str, dict[str, str]] = {}  # aliyun: role name -> its STS credentials document
        self.credential_requests = 0
        self.down = False  # answer 500 to everything, like a metadata service in trouble
        self.requests = 0
        self.token_requests = 0
        self.refused_without_token = 0  # reads that came without a valid token (401)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> LocalMetadataServer:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.*}", self._meta_data)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what the cloud does ------------------------------------------------------------------------------

    def interrupt(self, seconds: float = 120.0) -> datetime:
        """Post a spot interruption notice: the instance goes away ``seconds`` from now."""
        self.interruption = datetime.now(UTC) + timedelta(seconds=seconds)
        return self.interruption

    def recommend_rebalance(self) -> None:
        self.rebalance_at = datetime.now(UTC)

    def expire_tokens(self) -> None:
        self.tokens.clear()

    # -- handlers -----------------------------------------------------------------------------------------

    @property
    def token_header(self) -> str:
        return ALIYUN_TOKEN_HEADER if self.dialect == "aliyun" else TOKEN_HEADER

    @property
    def ttl_header(self) -> str:
        return ALIYUN_TTL_HEADER if self.dialect == "aliyun" else TTL_HEADER

    async def _token(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.down:
            return web.Response(status=500)
        try:
            ttl = int(request.headers.get(self.ttl_header, ""))
        except ValueError:
            return web.Response(status=400, text="missing or invalid " + self.ttl_header)
        if not 1 <= ttl <= 21600:
            return web.Response(status=400, text="TTL must be 1..21600")
        self.token_requests += 1
        token = secrets.token_urlsafe(32)
        self.tokens[token] = time.monotonic() + ttl
        return web.Response(text=token, headers={self.ttl_header: str(ttl)})

    async def _meta_data(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.down:
            return web.Response(status=500)
        path = request.match_info["path"]
        expires = self.tokens.get(request.headers.get(self.token_header, ""))
        if expires is None or expires < time.monotonic():
            self.refused_without_token += 1
            return web.Response(status=401)
        if self.dialect == "aliyun":
            return self._aliyun(path)
        if path == "instance-id":
            return web.Response(text=self.instance_id)
        if path == "spot/instance-action" and self.interruption is not None:
            body = {"action": "terminate", "time": _stamp(self.interruption)}
            return web.Response(text=json.dumps(body), content_type="application/json")
        if path == "events/recommendations/rebalance" and self.rebalance_at is not None:
            body = {"noticeTime": _stamp(self.rebalance_at)}
            return web.Response(text=json.dumps(body), content_type="application/json")
        return web.Response(status=404)

    def _aliyun(self, path: str) -> web.Response:
        """ECS metadata in the hardened mode (the token was checked by the caller)."""
        if path == "instance-id":
            return web.Response(text=self.instance_id)
        if path == "instance/spot/termination-time" and self.interruption is not None:
            return web.Response(text=_stamp(self.interruption))
        if path.rstrip("/") == "ram/security-credentials" and self.ram_roles:
            return web.Response(text="\n".join(self.ram_roles))
        role = path.removeprefix("ram/security-credentials/")
        if role != path and role in self.ram_roles:
            self.credential_requests += 1
            return web.Response(text=json.dumps(self.ram_roles[role]), content_type="text/plain")
        return web.Response(status=404)
