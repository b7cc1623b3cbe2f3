"""What the DingTalk side has already done, kept in Redis so restarts and replicas agree (which cards exist)."""

from __future__ import annotations

from typing import Protocol

from bot.keys import Keys
from bot.store import JobStore

LEDGER_TTL = 30 * 86400  # a card is updated for as long as its job runs; a month covers any fine-tune


class Ledger(Protocol):
    async def done(self, key: str) -> bool: ...

    async def mark(self, key: str) -> None: ...


class StoreLedger:
    """The ledger on the job store's once-only keys."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    async def done(self, key: str) -> bool:
        return await self.store.was_done(Keys.dingtalk(key))

    async def mark(self, key: str) -> None:
        await self.store.claim_once(Keys.dingtalk(key), LEDGER_TTL)
