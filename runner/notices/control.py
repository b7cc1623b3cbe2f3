"""The bot's control channel: an object the runner polls next to its checkpoints.

``<checkpoint_uri>control/attempt-<n>.json`` holds a :data:`handlers.spec.ControlRequest` (the one definition the
bot writes too): stop (checkpoint, commit, exit), interrupt-test (act as on a spot notice with its deadline,
for clouds without a fault-injection service) or save (a fresh checkpoint, training on: an early signal only the
bot heard, such as an Alibaba scheduled system event). An object rather than SSM Run Command: it needs only the storage
access the runner already has, and works the same on S3, OSS and a local directory.

A node of a gang also polls its own object of its generation, ``control/attempt-<n>/generation-<g>/node-<k>.json``
(:func:`handlers.spec.node_control_key`): a stop or interrupt-test there is for that node alone, and a regroup
(the next generation's world, this node's rank in it) is what a node standing by waits for (:func:`read_regroup`);
while training, the watcher passes a regroup over.

A runner launched ahead of a switch of market (``JobSpec.handover``) waits for go in the attempt's object
(:func:`read_go`) before it restores: the previous attempt trains until this one is up, then commits.
"""

from __future__ import annotations

from handlers.reports import InstanceNotice
from handlers.spec import (
    AnyControl,
    GoControl,
    InterruptTestControl,
    RegroupControl,
    SaveControl,
    StopControl,
    control_key,
    node_control_key,
    parse_control,
)
from runner.errors import NoticeUnavailable
from runner.storage.base import ObjectStore, StorageError

CONTROL_POLL_SECONDS = 5.0
# A gang survivor standing by polls its regroup faster: every second it waits, its whole node waits, billing, and
# the replacement's trainer waits for it at the rendezvous. A GET a second for the minutes of a hold costs nothing.
STANDBY_POLL_SECONDS = 1.0


def gang_control_keys(attempt: int, generation: int, node_rank: int) -> list[str]:
    """What a gang node polls: the attempt's object (the whole gang), then its own of this generation."""
    return [control_key(attempt), node_control_key(attempt, generation, node_rank)]


async def read_control(store: ObjectStore, key: str) -> AnyControl | None:
    """The control object at ``key``, or None when there is none; :class:`NoticeUnavailable` when it cannot be read
    or makes no sense."""
    try:
        raw = await store.get_bytes(key)
    except StorageError as exc:
        raise NoticeUnavailable(f"control object unreadable: {exc}") from exc
    if raw is None:
        return None
    try:
        return parse_control(raw)
    except ValueError as exc:
        raise NoticeUnavailable(f"control object is malformed or asks for an unknown type: {raw[:100]!r}") from exc


async def read_regroup(store: ObjectStore, key: str) -> RegroupControl | None:
    """A regroup in this node's own control object, if the bot wrote one."""
    request = await read_control(store, key)
    return request if isinstance(request, RegroupControl) else None


async def read_go(store: ObjectStore, key: str) -> bool:
    """Whether the bot wrote go to a runner launched ahead of a switch of market (the previous attempt is done)."""
    return isinstance(await read_control(store, key), GoControl)


class ControlObjectSource:
    name = "control"

    def __init__(self, store: ObjectStore, attempt: int, keys: list[str] | None = None) -> None:
        self.store = store
        self.keys = keys or [control_key(attempt)]  # a gang node: replaced at each regroup

    @property
    def key(self) -> str:
        return self.keys[0]

    async def poll(self) -> list[InstanceNotice]:
        notices = []
        for key in list(self.keys):
            request = await read_control(self.store, key)
            if isinstance(request, StopControl):
                notices.append(InstanceNotice(kind="stop", source="control", deadline=None))
            elif isinstance(request, SaveControl):  # an early signal only the bot heard: save, train on
                notices.append(InstanceNotice(kind="save", source="control", deadline=None))
            elif isinstance(request, InterruptTestControl):
                notices.append(
                    InstanceNotice(kind="spot-interruption", source="interrupt-test", deadline=request.deadline)
                )
        return notices

    async def instance_id(self) -> str | None:
        return None

    async def close(self) -> None:
        return None
