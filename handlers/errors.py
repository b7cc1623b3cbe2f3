"""The pure core's error tree: a root, :class:`CoreError` (a ``ValueError``, as pydantic's validators and every
``except ValueError`` around a parser expect), and the two refusals callers tell apart by type.

    CoreError
    ├── ReasonError            a refusal worded for the person who caused it, as a catalogue Reason: a command
    │                          that does not parse (``usage.*``), a recipe or an override it refuses (``recipe.*``),
    │                          a job option out of range (``option.*``)
    └── UnrecognisedMessage    input from outside that the core does not understand: a cloud's event, an SQS or SNS
                               message, a runner's report, JSON too large, too deep or not JSON at all

A spec that must not run, or a gang node that cannot be placed yet, is a plain ``ValueError`` saying why: no caller
tells it apart from the others. The core imports neither bot nor runner, so its tree is its own; the bot's root is
``bot.errors.FinetuneError``, the runner's ``runner.errors.RunnerError``.
"""

from __future__ import annotations

from handlers.reasons import Reason


class CoreError(ValueError):
    """The root of the errors the core raises on purpose: ``str()`` says what was refused and why."""


class ReasonError(CoreError):
    """An error whose message is meant for the person who caused it; ``str()`` is the English sentence. One class for
    every such refusal (a command, a recipe, a job option): callers render ``reason`` and never tell them apart; its
    catalogue key says which it is."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.english)
        self.reason = reason


class UnrecognisedMessage(CoreError):
    """Not something this bot understands; ``reason`` says why, for the log, the HTTP answer and whoever reads the
    dead letters. Every parser in ``handlers/`` raises it, every source in ``bot/sources/`` catches it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
