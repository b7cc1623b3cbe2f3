"""A local HTTP server that answers every request one broken way, in the place of a platform's API: what a load
balancer, a proxy or a dying endpoint sends back. The mapping tests point each adapter's real SDK at it.

``hang-up``: the connection closes without a reply; ``html-502``: a proxy's HTML error page; ``html-400``: the same
for a 400; ``empty-500``: a 500 with no body; ``not-json-200``: a 200 whose body no SDK can read.
"""

from __future__ import annotations

from aiohttp import web

from fakes.ports import free_port

WAYS = ("hang-up", "html-502", "html-400", "empty-500", "not-json-200")


class BrokenHttp:
    def __init__(self, how: str) -> None:
        if how not in WAYS:
            raise ValueError(f"{how!r} is not one of {WAYS}")
        self.how = how
        self.port = free_port()
        self.requests = 0
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> BrokenHttp:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        if self.how == "hang-up":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.how.startswith("html-"):
            status = int(self.how.removeprefix("html-"))
            return web.Response(status=status, text="<html>Bad Gateway</html>", content_type="text/html")
        if self.how == "empty-500":
            return web.Response(status=500, text="", content_type="application/json")
        return web.Response(status=200, body=b"\x00\xffnot json", content_type="text/plain")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
