"""The ``/finetune`` command grammar, shared by Slack, DingTalk and the console.

Parsing only splits on whitespace and matches words: no quoting rules, no expansion, nothing a shell would
interpret. Anything malformed raises :class:`UsageError` carrying the usage line to answer with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from handlers.ids import JOB_ID_PATTERN

_JOB_ID = re.compile(JOB_ID_PATTERN)
_RECIPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,40}$")
_OVERRIDE = re.compile(r"^([a-z_][a-z0-9_]{0,40})=(\S{1,200})$")
MAX_COMMAND_LENGTH = 2000

USAGE = {
    "start": "start <recipe> [key=value …]",
    "stop": "stop <job>",
    "interrupt-test": "interrupt-test <job>",
    "status": "status [job]",
    "list": "list",
    "logs": "logs <job>",
    "ack": "ack <job>",
    "resume": "resume <job> [on-demand]",
    "help": "help",
}
HELP = "/finetune " + "\n/finetune ".join(USAGE.values())

Action = Literal["start", "stop", "interrupt-test", "status", "list", "logs", "ack", "resume", "help"]


class UsageError(ValueError):
    """A command that does not parse; the message says what was wrong and shows the usage."""


@dataclass(frozen=True, slots=True)
class Command:
    action: Action
    job_id: str | None = None
    recipe: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    on_demand: bool = False


def parse(text: str) -> Command:
    """Parse the text after ``/finetune`` (a leading ``/finetune`` is accepted too)."""
    if len(text) > MAX_COMMAND_LENGTH:
        raise UsageError(f"command too long (over {MAX_COMMAND_LENGTH} characters)\n{HELP}")
    words = text.split()
    if words and words[0].lower() == "/finetune":
        words = words[1:]
    if not words:
        return Command("help")
    verb, args = words[0].lower(), words[1:]
    if verb == "help":
        return Command("help")
    if verb == "list":
        _expect(verb, args, 0)
        return Command("list")
    if verb == "start":
        return _start(args)
    if verb == "status":
        if len(args) > 1:
            raise _usage(verb, "takes at most one job id")
        return Command("status", job_id=_job(verb, args[0]) if args else None)
    if verb == "resume":
        if len(args) not in (1, 2) or (len(args) == 2 and args[1].lower() != "on-demand"):
            raise _usage(verb, "takes a job id and optionally the word on-demand")
        return Command("resume", job_id=_job(verb, args[0]), on_demand=len(args) == 2)
    if verb in ("stop", "interrupt-test", "logs", "ack"):
        _expect(verb, args, 1)
        return Command(verb, job_id=_job(verb, args[0]))  # type: ignore[arg-type]
    raise UsageError(f"unknown command {_shown(verb)}\n{HELP}")


def _start(args: list[str]) -> Command:
    if not args:
        raise _usage("start", "needs a recipe")
    recipe = args[0].lower()
    if not _RECIPE.match(recipe):
        raise _usage("start", f"{_shown(args[0])} is not a recipe name")
    overrides: dict[str, str] = {}
    for arg in args[1:]:
        match = _OVERRIDE.match(arg)
        if not match:
            raise _usage("start", f"{_shown(arg)} is not key=value")
        key, value = match.groups()
        if key in overrides:
            raise _usage("start", f"{key} is given twice")
        overrides[key] = value
    return Command("start", recipe=recipe, overrides=overrides)


def _job(verb: str, word: str) -> str:
    job_id = word.lower()
    if not _JOB_ID.match(job_id):
        raise _usage(verb, f"{_shown(word)} is not a job id (they look like ft-7k2q)")
    return job_id


def _expect(verb: str, args: list[str], count: int) -> None:
    if len(args) != count:
        raise _usage(verb, "takes no arguments" if count == 0 else "takes exactly one job id")


def _usage(verb: str, problem: str) -> UsageError:
    return UsageError(f"{verb} {problem}. Usage: /finetune {USAGE[verb]}")


def _shown(word: str) -> str:
    """A user's word echoed back safely: bounded and printable."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in word[:40])
    return repr(clean)
