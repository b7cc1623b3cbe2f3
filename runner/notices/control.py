"""The bot's control channel: an object the runner polls next to its checkpoints.

``<checkpoint_uri>control/attempt-<n>.json`` holds ``{"action": "stop"}`` (checkpoint, commit, exit) or
``{"action": "drill", "deadline": "<UTC time>"}`` (behave exactly as on a spot notice with that deadline, for
clouds without a fault-injection service). An object rather than SSM Run Command: it needs only the storage
access the runner already has, and works the same on S3, OSS and a local directory.
"""

from __future__ import annotations

import json

from runner.notices.aws import parse_time
from runner.notices.base import MetadataUnavailable, Notice
from runner.storage.base import ObjectStore, StorageError

CONTROL_POLL_SECONDS = 5.0


def control_key(attempt: int) -> str:
    return f"control/attempt-{attempt}.json"


class ControlObjectSource:
    name = "control"

    def __init__(self, store: ObjectStore, attempt: int) -> None:
        self.store = store
        self.key = control_key(attempt)

    async def poll(self) -> list[Notice]:
        try:
            raw = await self.store.get_bytes(self.key)
        except StorageError as exc:
            raise MetadataUnavailable(f"control object unreadable: {exc}") from exc
        if raw is None:
            return []
        try:
            command = json.loads(raw)
            action = command["action"]
            if action == "stop":
                return [Notice("stop", "control", None)]
            if action == "drill":
                return [Notice("spot-interruption", "drill", parse_time(command["deadline"]))]
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataUnavailable(f"control object is malformed: {raw[:100]!r}") from exc
        raise MetadataUnavailable(f"control object asks for an unknown action {action!r}")

    async def instance_id(self) -> str | None:
        return None

    async def close(self) -> None:
        return None
