"""``file:///path.jsonl``: append one line per report (the local cloud and tests read it back)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote, urlparse


class FileTarget:
    def __init__(self, target: str) -> None:
        self.name = target
        self.path = Path(unquote(urlparse(target).path))

    async def deliver(self, line: str, report_type: str) -> None:
        await asyncio.to_thread(self._append, line)

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One write() of a whole line in append mode: concurrent writers never interleave within a line.
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    async def close(self) -> None:
        return None
