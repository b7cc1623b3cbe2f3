"""The bot's control channel: an object the runner polls next to its checkpoints.

``<checkpoint_uri>control/attempt-<n>.json`` holds a :data:`handlers.spec.ControlRequest` (the one definition the
bot writes too): stop (checkpoint, commit, exit) or interrupt-test (act as on a spot notice with its deadline,
for clouds without a fault-injection service). An object rather than SSM Run Command: it needs only the storage
access the runner already has, and works the same on S3, OSS and a local directory.
"""

from __future__ import annotations

from handlers.reports import InstanceNotice
from handlers.spec import InterruptTestControl, StopControl, control_key, parse_control
from runner.errors import ControlUnreadable
from runner.storage.base import ObjectStore, StorageError

CONTROL_POLL_SECONDS = 5.0


class ControlObjectSource:
    name = "control"

    def __init__(self, store: ObjectStore, attempt: int) -> None:
        self.store = store
        self.key = control_key(attempt)

    async def poll(self) -> list[InstanceNotice]:
        try:
            raw = await self.store.get_bytes(self.key)
        except StorageError as exc:
            raise ControlUnreadable(f"control object unreadable: {exc}") from exc
        if raw is None:
            return []
        try:
            request = parse_control(raw)
        except ValueError as exc:
            raise ControlUnreadable(
                f"control object is malformed or asks for an unknown type: {raw[:100]!r}"
            ) from exc
        if isinstance(request, StopControl):
            return [InstanceNotice(kind="stop", source="control", deadline=None)]
        assert isinstance(request, InterruptTestControl)
        return [InstanceNotice(kind="spot-interruption", source="interrupt-test", deadline=request.deadline)]

    async def instance_id(self) -> str | None:
        return None

    async def close(self) -> None:
        return None
