"""What a notice watcher reports: the cloud (or an operator) wants this instance back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

NoticeKind = Literal["spot-interruption", "rebalance", "termination", "stop"]


class MetadataUnavailable(RuntimeError):
    """The metadata service did not answer usefully; training goes on regardless."""


@dataclass(frozen=True, slots=True)
class Notice:
    """One notice; ``deadline`` is when the machine goes away (``None``: no fixed time, e.g. rebalance)."""

    kind: NoticeKind
    source: str
    deadline: datetime | None = None

    @property
    def interrupts(self) -> bool:
        """Rebalance only advises; every other kind ends this attempt."""
        return self.kind != "rebalance"


class NoticeSource(Protocol):
    """One metadata service, asked once per polling round."""

    name: str

    async def poll(self) -> list[Notice]:
        """The notices standing now (may repeat every round); raise MetadataUnavailable when unreachable."""
        ...

    async def instance_id(self) -> str | None: ...

    async def close(self) -> None: ...
