"""What a notice watcher reports: the cloud (or an operator) wants this instance back."""

from __future__ import annotations

from typing import Protocol

from handlers.reports import InstanceNotice


class MetadataUnavailable(RuntimeError):
    """The metadata service did not answer usefully; training goes on regardless."""


class NoticeSource(Protocol):
    """One metadata service, asked once per polling round."""

    name: str

    async def poll(self) -> list[InstanceNotice]:
        """The notices standing now (may repeat every round); raise MetadataUnavailable when unreachable."""
        ...

    async def instance_id(self) -> str | None: ...

    async def close(self) -> None: ...
