"""The ``/finetune`` command grammar, shared by Slack, DingTalk and the console.

Parsing only splits on whitespace and matches words: no quoting rules, no expansion, nothing a shell would
interpret. Anything malformed raises :class:`~handlers.reasons.ReasonError` carrying the usage line to answer with, as a
:class:`~handlers.reasons.Reason` (English by ``str()``, the channel's language once the bot renders it).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Literal

from handlers.cost_report import DEFAULT_WINDOW, WINDOWS
from handlers.errors import ReasonError
from handlers.ids import JOB_ID_PATTERN
from handlers.outside_text import clean_line
from handlers.reasons import Wording

_JOB_ID = re.compile(JOB_ID_PATTERN)
_RECIPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,40}$")
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_OVERRIDE = re.compile(r"^([a-z_][a-z0-9_]{0,40})=(\S{1,200})$")
_NODE = re.compile(r"^node=(\d{1,2})$")
MAX_COMMAND_LENGTH = 2000


def _slot(verb: str) -> str:
    """The placeholder of a verb's usage line in ``help`` (``interrupt-test`` → ``interrupt_test``)."""
    return verb.replace("-", "_")


USAGE = {
    "start": "start <recipe> [key=value …] [deadline=36h] [budget=120] [nodes=2]",
    "stop": "stop <job>",
    "interrupt-test": "interrupt-test <job> [node=K]",
    "status": "status [job]",
    "list": "list",
    "logs": "logs <job>",
    "history": "history <job>",
    "chart": "chart <job>",
    "ack": "ack <job>",
    "resume": "resume <job> [on-demand]",
    "costs": "costs [7d|30d] [team=name]",
    "help": "help",
}

# What each command does, for ``help`` (one line each; the catalogue says it in the channel's language).
DOES = {
    "start": "start a training job from a recipe (below), optionally with a deadline or a budget",
    "stop": "checkpoint, then release the instance",
    "interrupt-test": "a real spot interruption of the job's instance (a multi-node job's node K), to check recovery",
    "status": "the job's card (without a job: the list)",
    "list": "the latest jobs, with their step",
    "logs": "the tail of the trainer's log (its latest attempt's)",
    "history": "the job's history, with times",
    "chart": "the job's loss curve with its cost, posted in its thread",
    "ack": "acknowledge the job's on-call page",
    "resume": "continue a failed or stopped job from its checkpoint (optionally on on-demand)",
    "costs": "spend, on-demand cost, savings, steps lost and restart hours by team, user and recipe",
    "help": "this help",
}

# What a malformed command is answered with (the catalogue's ``usage.*`` and ``help``; see handlers.reasons).
WORDING = Wording(
    {
        **{f"usage.line.{verb}": line for verb, line in USAGE.items()},
        "help": "\n".join(f"/finetune {{{_slot(verb)}}} — {DOES[verb]}" for verb in USAGE),
        "usage.error": "{verb} {problem}. Usage: /finetune {usage}",
        "usage.too-long": "command too long (over {limit} characters)\n{help}",
        "usage.unknown": "unknown command {word}\n{help}",
        "usage.unknown-close": "unknown command {word}: did you mean {verb}? ({help} lists every command)",
        "usage.at-most-one-job": "takes at most one job id",
        "usage.resume-args": "takes a job id and optionally the word on-demand",
        "usage.needs-recipe": "needs a recipe",
        "usage.not-recipe": "{word} is not a recipe name",
        "usage.not-key-value": "{word} is not key=value",
        "usage.given-twice": "{key} is given twice",
        "usage.not-job-id": "{word} is not a job id (they look like ft-7k2q)",
        "usage.no-arguments": "takes no arguments",
        "usage.one-job": "takes exactly one job id",
        "usage.costs-args": "takes a window (7d or 30d) and a team=name, each at most once",
        "usage.node": "takes a job id and optionally node=K (a node's number, 0 to 63), not {word}",
    }
)
HELP_REASON = WORDING("help", **{_slot(verb): WORDING(f"usage.line.{verb}") for verb in USAGE})
HELP = HELP_REASON.english

Action = Literal[
    "start", "stop", "interrupt-test", "status", "list", "logs", "history", "chart", "ack", "resume", "costs", "help"
]


@dataclass(frozen=True, slots=True)
class Command:
    action: Action
    job_id: str | None = None
    recipe: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    on_demand: bool = False
    window: str = DEFAULT_WINDOW  # costs: how far back
    team: str | None = None  # costs: one team's only
    node: int | None = None  # interrupt-test of one node of a multi-node job


def parse(text: str) -> Command:
    """Parse the text after ``/finetune`` (a leading ``/finetune`` is accepted too).

    Every chat (Slack, DingTalk, the console, a card's button) sends what a person typed here, so this is where it
    is cleaned (:func:`handlers.outside_text.clean_line`): nothing of it that is echoed back holds an escape
    sequence, a control character or a mention marker."""
    if len(text) > MAX_COMMAND_LENGTH:
        raise ReasonError(WORDING("usage.too-long", limit=MAX_COMMAND_LENGTH, help=HELP_REASON))
    words = clean_line(text).split()
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
            raise _usage(verb, "usage.at-most-one-job")
        return Command("status", job_id=_job(verb, args[0]) if args else None)
    if verb == "resume":
        if len(args) not in (1, 2) or (len(args) == 2 and args[1].lower() != "on-demand"):
            raise _usage(verb, "usage.resume-args")
        return Command("resume", job_id=_job(verb, args[0]), on_demand=len(args) == 2)
    if verb == "costs":
        return _costs(args)
    if verb == "interrupt-test" and len(args) == 2:
        node = _NODE.fullmatch(args[1].lower())
        if node is None or int(node.group(1)) > 63:
            raise _usage(verb, "usage.node", word=_shown(args[1]))
        return Command("interrupt-test", job_id=_job(verb, args[0]), node=int(node.group(1)))
    if verb in ("stop", "interrupt-test", "logs", "history", "chart", "ack"):
        _expect(verb, args, 1)
        return Command(verb, job_id=_job(verb, args[0]))  # type: ignore[arg-type]
    meant = _meant(verb)
    if meant is not None:
        raise ReasonError(WORDING("usage.unknown-close", word=_shown(verb), verb=meant, help="/finetune help"))
    raise ReasonError(WORDING("usage.unknown", word=_shown(verb), help=HELP_REASON))


def _meant(verb: str) -> str | None:
    """The command a mistyped ``verb`` most likely meant: one it begins (``stat`` → ``status``, not ``start``),
    else the closest spelling (``lgos`` → ``logs``); None when nothing is close."""
    begun = [known for known in USAGE if known.startswith(verb)]
    close = difflib.get_close_matches(verb, begun, n=1, cutoff=0) or difflib.get_close_matches(verb, USAGE, n=1)
    return close[0] if close else None


def _start(args: list[str]) -> Command:
    if not args:
        raise _usage("start", "usage.needs-recipe")
    recipe = args[0].lower()
    if not _RECIPE.fullmatch(recipe):
        raise _usage("start", "usage.not-recipe", word=_shown(args[0]))
    overrides: dict[str, str] = {}
    for arg in args[1:]:
        match = _OVERRIDE.fullmatch(arg)
        if not match:
            raise _usage("start", "usage.not-key-value", word=_shown(arg))
        key, value = match.groups()
        if key in overrides:
            raise _usage("start", "usage.given-twice", key=key)
        overrides[key] = value
    return Command("start", recipe=recipe, overrides=overrides)


def _costs(args: list[str]) -> Command:
    window: str | None = None
    team: str | None = None
    for arg in args:
        word = arg.lower()
        if word in WINDOWS and window is None:
            window = word
        elif word.startswith("team=") and team is None and _TEAM.fullmatch(arg[5:]):
            team = arg[5:]
        else:
            raise _usage("costs", "usage.costs-args")
    return Command("costs", window=window or DEFAULT_WINDOW, team=team)


def _job(verb: str, word: str) -> str:
    job_id = word.lower()
    if not _JOB_ID.fullmatch(job_id):
        raise _usage(verb, "usage.not-job-id", word=_shown(word))
    return job_id


def _expect(verb: str, args: list[str], count: int) -> None:
    if len(args) != count:
        raise _usage(verb, "usage.no-arguments" if count == 0 else "usage.one-job")


def _usage(verb: str, problem: str, /, **values: str) -> ReasonError:
    """A command that does not parse: its reason (``usage.*``) says what was wrong and shows the usage."""
    return ReasonError(
        WORDING("usage.error", verb=verb, problem=WORDING(problem, **values), usage=WORDING(f"usage.line.{verb}"))
    )


def _shown(word: str) -> str:
    """A user's word echoed back safely: bounded and printable."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in word[:40])
    return repr(clean)
