"""What a notice watcher reports: the cloud (or an operator) wants this instance back."""

from __future__ import annotations

from typing import Protocol

from handlers.reports import InstanceNotice
from runner.errors import NoticeUnavailable

__all__ = ["NoticeSource", "NoticeUnavailable"]


class NoticeSource(Protocol):
    """One metadata service, asked once per polling round."""

    name: str

    async def poll(self) -> list[InstanceNotice]:
        """The notices standing now (may repeat every round); raise NoticeUnavailable when unreachable."""
        ...

    async def instance_id(self) -> str | None: ...

    async def close(self) -> None: ...
