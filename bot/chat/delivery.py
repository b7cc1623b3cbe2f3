"""What a chat platform's sender promises the durable outbox: deliver, or say whether to try again.

A platform plugs into the outbox (``bot/chat/outbox.py``) with one of two shapes:

- a :class:`Deliverer` (``async deliver(job, note)``): sends one notification, or refreshes the job's card when
  the note is a ``card`` note; the outbox keeps order, retries, dedups and coalesces card refreshes around it;
- a :class:`CardDeliverer` (Slack): posts the card once, edits it in place, replies under it; the outbox also
  remembers where the card is (``bot/chat/refs.py``) and posts it before anything is replied under it.

Either way a call delivers, or raises :class:`TransientDeliveryError` (the platform is down, slow or
rate-limiting: try again, after ``retry_after`` seconds when it said so) or :class:`PermanentDeliveryError` (the
request itself is wrong: retrying changes nothing). That split is all the outbox needs to keep a message until it
can go, and to drop one that never will.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from bot.chat.catalog import Lang
from bot.errors import ChatError
from handlers.jobs import ChatRef, Job
from handlers.messages import Notify


class TransientDeliveryError(ChatError):
    """5xx, 429, a timeout or a dropped connection: the same request may succeed later."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentDeliveryError(ChatError):
    """The platform refused the request for a reason a retry does not change (bad id, no permission, …)."""


class Deliverer(Protocol):
    async def deliver(self, job: Job, note: Notify) -> None:
        """Send ``note`` about ``job`` (or refresh its card), raising a ``ChatError`` when it did not go."""
        ...


@dataclass(frozen=True, slots=True)
class MessageRef:
    """A message the bot posted, so it can be edited or replied to later (Slack: channel id and ``ts``)."""

    channel: str
    ts: str
    text: str = ""

    def dump(self) -> str:
        return json.dumps({"channel": self.channel, "ts": self.ts, "text": self.text})

    @classmethod
    def load(cls, raw: str) -> MessageRef:
        data = json.loads(raw)
        return cls(channel=str(data["channel"]), ts=str(data["ts"]), text=str(data.get("text", "")))


@runtime_checkable
class CardDeliverer(Protocol):
    """A platform that edits one card per job in place and replies under it. Every method may raise a
    ``ChatError``; a method may be retried after one, so each does at most one non-repeatable post, as
    its last step.
    """

    async def post_card(self, job: Job) -> MessageRef:
        """Post the job's card (its latest state) where the job was started."""
        ...

    async def edit_card(self, job: Job, card: MessageRef) -> None:
        """Show the job's latest state on its card, in place."""
        ...

    async def post_note(self, job: Job, note: Notify, card: MessageRef | None) -> None:
        """Post a thread, alert or page note (``card`` is the job's card, to reply under, if it could be posted)."""
        ...


@runtime_checkable
class PostedCheck(Protocol):
    """A platform that can tell whether a note was posted already: asked only when a delivery may have gone
    through without the outbox hearing it (the replica died mid-post, the platform timed out or answered 5xx),
    so a note is posted once even then. Without it such a note may be posted twice (at least once)."""

    async def posted(self, job: Job, note: Notify, card: MessageRef | None) -> bool: ...


# Draws the job's chart as a PNG, with its words in a language, as at a moment (the outbox hands one to the
# platform, which knows the channel's language and its clock).
Draw = Callable[[Lang, datetime], Awaitable[bytes]]


@runtime_checkable
class ImagePoster(Protocol):
    """A platform that can post an image where the job's notes go: the job's chart (a ``chart`` note). Without it
    the note is posted as its words only. One non-repeatable post, as the last step, like every other call here."""

    async def post_image(self, job: Job, note: Notify, draw: Draw, card: MessageRef | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Picture:
    """An image with its words, in a channel's language: the PNG, its title (alt text) and the caption posted with
    it."""

    png: bytes
    title: str
    caption: str


# Draws a picture that belongs to no job (a costs report's chart) in a language: the platform knows the channel's.
DrawPicture = Callable[[Lang], Awaitable[Picture]]


@runtime_checkable
class ChannelImagePoster(Protocol):
    """A platform that can post an image into a channel, outside any job's thread: a costs report's chart, where
    the report was asked. ``name`` is the outbox entry's and the file's (``<id>.png``), so a post that may have gone
    through unheard can be looked for (``in_doubt``: look first, from ``at``, when it was asked; found, post
    nothing). Without it the chart is not posted (the command's words were the answer). One non-repeatable post, as
    the last step."""

    async def post_channel_image(
        self, chat: ChatRef, name: str, at: datetime, draw: DrawPicture, in_doubt: bool
    ) -> None: ...


class Gate:
    """One pause shared by every sender of a platform: after a rate limit or a failure all of them wait.

    Lanes retrying on their own would hammer a platform that just said "slow down" or is down.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until = 0.0

    def close_for(self, seconds: float) -> None:
        self._until = max(self._until, self.clock() + max(seconds, 0.0))

    @property
    def open(self) -> bool:
        return self.clock() >= self._until

    async def wait(self, stop: asyncio.Event) -> bool:
        """Wait until the gate opens; False if ``stop`` was set first."""
        while (left := self._until - self.clock()) > 0 and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), left)
        return not stop.is_set()


@dataclass(slots=True)
class Platform:
    """A platform as the outbox sees it: its deliverer and the pause all its senders share.

    ``coalesce_cards=False`` (a terminal, which cannot edit in place) hands the deliverer every card note, with
    the job as it is then, instead of one refresh per card every few seconds.
    """

    deliverer: Deliverer | CardDeliverer
    gate: Gate = field(default_factory=Gate)
    coalesce_cards: bool = True
    # What the deliverer can do, asked once here rather than for every note (a Protocol check is slow).
    cards: CardDeliverer | None = field(init=False, default=None)
    checks_posted: bool = field(init=False, default=False)
    images: ImagePoster | None = field(init=False, default=None)
    channel_images: ChannelImagePoster | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.cards = self.deliverer if isinstance(self.deliverer, CardDeliverer) else None
        self.checks_posted = isinstance(self.deliverer, PostedCheck)
        self.images = self.deliverer if isinstance(self.deliverer, ImagePoster) else None
        self.channel_images = self.deliverer if isinstance(self.deliverer, ChannelImagePoster) else None
