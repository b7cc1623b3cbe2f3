"""The console chat: the bot's messages printed to a terminal, for ``finetune-bot chat`` and the demo.

A terminal cannot edit a message in place, so the job card is printed again only when the job's state
changes, not on every step.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot.chat.render import card_text, mentions, message_text
from handlers.events import utcnow
from handlers.jobs import Job, JobState
from handlers.messages import Notify


class ConsoleChat:
    def __init__(self, write: Callable[[str], None] = print, clock: Callable[[], datetime] = utcnow) -> None:
        self.write = write
        self.clock = clock
        self.transcript: list[tuple[str, str, str]] = []  # (job id, channel, text)
        self._shown_state: dict[str, JobState] = {}
        self._last = ""

    async def notify(self, job: Job, note: Notify) -> None:
        if note.channel == "card":
            if self._shown_state.get(job.id) == job.state:
                return
            self._shown_state[job.id] = job.state
            text = card_text(job, self.clock())
        else:
            text = message_text(job, note, self.clock())
            if note.channel == "page":
                text = "[PAGE] " + mentions(note) + text
            elif note.channel == "alert":
                text = "[ALERT] " + text
        self.transcript.append((job.id, note.channel, text))
        if note.channel == "thread" and self._last == "[ALERT] " + text:
            return  # one terminal is both the alert channel and the thread: say it once
        self._last = text
        self.write(text)
