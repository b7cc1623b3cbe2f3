"""The console chat: the bot's messages printed to a terminal, for ``finetune-bot chat`` and the demo.

A terminal cannot edit a message in place, so the job card is printed again only when the job's state
changes, not on every step. Nor can it show an image: a job's chart (``/finetune chart``) is written to a PNG file
in the state directory, and its path is printed (:class:`ConsoleDeliverer`).

:func:`read_commands` is the input side. On a terminal it is a prompt_toolkit prompt, and everything printed
while it waits (the bot's updates, answers) goes above the line being typed, which stays intact; Ctrl-D and
Ctrl-C end it cleanly. Piped input (scripts, tests) is read line by line without a prompt.

Everything printed goes through :func:`terminal_text`: text from outside was cleaned where it entered
(:mod:`handlers.outside_text`), and what reaches the terminal is escaped for it once more, as Slack's and DingTalk's
markup is for them, so no byte anywhere can move the cursor, recolour, retitle or clear the operator's terminal.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

from bot.chat.base import PortDeliverer
from bot.chat.catalog import plain, text
from bot.chat.delivery import Draw, MessageRef
from bot.chat.render import card_text, mentions, message_text
from handlers.clock import utcnow
from handlers.jobs import Job, JobState
from handlers.messages import Notify
from handlers.notes import ResumeFailedPage

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # a newline and a tab are the controls a terminal gets


def terminal_text(sentence: str) -> str:
    """A sentence for the terminal: persons as their names, every control character but a newline or a tab
    shown as its escape (``\\x1b``), never sent as itself."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", plain(sentence))


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
            text = terminal_text(card_text(job, self.clock()))
        else:
            text = terminal_text(message_text(job, note, self.clock()))
            if isinstance(note.note, ResumeFailedPage):
                text = "[PAGE] " + mentions(note.note) + text
            elif note.channel == "alert":
                text = "[ALERT] " + text
        self.transcript.append((job.id, note.channel, text))
        if note.channel == "thread" and self._last == "[ALERT] " + text:
            return  # one terminal is both the alert channel and the thread: say it once
        self._last = text
        self.write(text)

    async def chart_written(self, job: Job, note: Notify, path: Path) -> None:
        """Say where the job's chart was written, under its caption."""
        said = terminal_text(message_text(job, note, self.clock()) + "\n" + text("en", "console.chart-file", path=path))
        self.transcript.append((job.id, note.channel, said))
        self._last = said
        self.write(said)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class ConsoleDeliverer(PortDeliverer):
    """The console as the chat outbox's deliverer: each note printed, and a job's chart, which a terminal cannot
    show, written to a PNG file in ``charts`` (one file per chart asked) whose path is printed."""

    def __init__(self, chat: ConsoleChat, charts: Path) -> None:
        super().__init__(chat)
        self.chat = chat
        self.charts = charts

    async def post_image(self, job: Job, note: Notify, draw: Draw, card: MessageRef | None) -> None:
        png = await draw("en", self.chat.clock())
        stem = note.id if note.id.startswith(job.id) else f"{job.id}-{note.id}"  # the job's id first, once
        name = _UNSAFE_NAME.sub("", stem)[:100] + ".png"
        path = await asyncio.to_thread(_write_png, self.charts, name, png)
        await self.chat.chart_written(job, note, path)


def _write_png(folder: Path, name: str, png: bytes) -> Path:
    """``png`` in ``folder/name``, whole or not at all (a reader never opens half an image)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / name).resolve()
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(png)
    partial.replace(path)
    return path


PROMPT = "/finetune "


async def read_commands(prompt: str = PROMPT) -> AsyncIterator[str]:
    """The lines typed (blank ones skipped) until end of input; Ctrl-C at the prompt ends it like Ctrl-D."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        async for line in _prompted(prompt):
            yield line
        return
    async for line in _piped():
        yield line


async def _prompted(prompt: str) -> AsyncIterator[str]:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.patch_stdout import patch_stdout

    session: PromptSession[str] = PromptSession()
    with patch_stdout(raw=True):  # print() from anywhere lands above the prompt, which is redrawn after it
        while True:
            try:
                line = await session.prompt_async(prompt)
            except (EOFError, KeyboardInterrupt):
                return
            if line.strip():
                yield line


async def _piped() -> AsyncIterator[str]:
    """Lines from a pipe or file, read by a daemon thread so that a pending read never holds up the exit."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def pump() -> None:
        try:
            for raw in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, raw.rstrip("\n"))
            loop.call_soon_threadsafe(lines.put_nowait, None)
        except RuntimeError:  # the loop closed first: the bot is on its way out
            return

    threading.Thread(target=pump, name="stdin", daemon=True).start()
    while (line := await lines.get()) is not None:
        if line.strip():
            yield line
