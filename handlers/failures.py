"""Why a job failed, as a code and values: what the job record, the on-call page, the notes and the runner's
``failed`` report carry instead of a sentence.

A :class:`~handlers.reasons.Reason` is said at once (an answer to a command); a failure is kept: it is stored on
the job (``Job.failure``, ``Page.reason``), travels on the bus in a note and comes from the runner in a report.
So it is a model (a ``code`` and its ``values``), put in words only where it is shown: the chat side renders it
in the channel's language from the catalogue (``failure.<code>``), and :attr:`Failure.english` gives the English
sentence, from :data:`WORDING` below (the English catalogue is made of it), for logs and job history.

What a cloud, a store or a trainer said (an exception's text, a log line) is a value: it passes through quoted,
as it was given; the sentence around it is the catalogue's. A value may itself be a Failure (how the last
attempt ended, inside "N attempts in a row…"), said in the same language.
"""

from __future__ import annotations

import string
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.reasons import Reason, Wording

FailureCode = Literal[
    # The bot's own (handlers/decide/).
    "launch-failed",
    "start-timeout",
    "replacement-gone",
    "no-progress",
    # How an attempt ended: a spot launch refused for capacity (the spot policy chooses again).
    "capacity",
    # How an attempt ended, inside "no-progress" (``last``).
    "interrupted",
    "instance-gone",
    "hung",
    # The runner's ``failed`` report (runner/reports/attempt.py, runner/trainer.py).
    "storage-unreachable",
    "trainer-not-found",
    "trainer-not-on-path",
    "trainer-not-executable",
    "trainer-out-of-reach",
    "trainer-not-started",
    "metadata-guard-failed",
    "trainer-exited",
    "trainer-exited-silent",
    "output-not-stored",
]
CODES: tuple[FailureCode, ...] = get_args(FailureCode)

# The English of every code: the sentences the bot and the runner always wrote, word for word.
WORDING = Wording(
    {
        "failure.launch-failed": "launch failed: {error}",
        "failure.start-timeout": "the runner did not report started in time",
        "failure.replacement-gone": "the replacement instance {instance} went away",
        "failure.no-progress": (
            "{count} attempt(s) in a row ended without progress, the last one {last}; not relaunching"
        ),
        "failure.capacity": "capacity: {error}",
        "failure.interrupted": "interrupted: {notice}",
        "failure.instance-gone": "instance gone: {detail}",
        "failure.hung": "the trainer hung twice on one instance, the second time at step {step}",
        "failure.storage-unreachable": "checkpoint storage unreachable: {error}",
        "failure.trainer-not-found": "cannot start the trainer: {program!r} not found",
        "failure.trainer-not-on-path": "cannot start the trainer: {program!r} not found on PATH ({path})",
        "failure.trainer-not-executable": "cannot start the trainer: {program!r} is not executable",
        "failure.trainer-out-of-reach": (
            "cannot start the trainer: {program!r} is out of reach of its user {user} (a folder on the way is closed "
            "to {user}); install it where {user} can reach it, or set {setting} to a user who can"
        ),
        "failure.trainer-not-started": "cannot start the trainer {program!r}: {error}",
        "failure.metadata-guard-failed": (
            "the trainer was not started: the metadata service could not be closed to its user ({error})"
        ),
        "failure.trainer-exited": "trainer exited with code {exit_code}; gave up after {restarts} restart(s): {line}",
        "failure.trainer-exited-silent": "trainer exited with code {exit_code}; gave up after {restarts} restart(s)",
        "failure.output-not-stored": "could not store the final output: {error}",
    }
)


class Failure(BaseModel):
    """One failure: ``code`` (``failure.<code>`` in the catalogue) and the ``values`` its sentence takes, exactly
    those (a value missing or extra fails here, where it is made, not when a channel renders it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    code: FailureCode
    values: dict[str, Failure | str | int | float] = Field(default_factory=dict)

    @classmethod
    def of(cls, code: FailureCode, /, **values: Failure | str | int | float) -> Failure:
        return cls(code=code, values=values)

    @model_validator(mode="after")
    def _values_fill_the_sentence(self) -> Failure:
        wanted = placeholders(WORDING.sentences[f"failure.{self.code}"])
        if set(self.values) != wanted:
            raise ValueError(f"failure {self.code} takes {sorted(wanted)}, not {sorted(self.values)}")
        return self

    def reason(self) -> Reason:
        """The same as a Reason, for the catalogue's ``say`` (a Failure inside it becomes a Reason too)."""
        values = {name: value.reason() if isinstance(value, Failure) else value for name, value in self.values.items()}
        return WORDING(f"failure.{self.code}", **values)

    @property
    def english(self) -> str:
        return self.reason().english

    def __str__(self) -> str:
        return self.english


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}
