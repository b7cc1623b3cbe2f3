"""On-call: who is paged when a resume fails, and how the page escalates until someone acknowledges it.

The rota says who is primary and secondary in each shift; the ladder says whom each step notifies and when,
counted from the moment the page opened (primary now, primary and secondary after 5 minutes, the whole channel
after 15, as PagerDuty and Opsgenie do it), then repeats its last step until acknowledged or out of repeats.

A page is part of the job record (:class:`handlers.jobs.Page`) and every step is a timer message
(:class:`handlers.messages.PageStep`). Sending a step is a job change like any other: it moves ``page.sent``
forward in the same transaction that puts the notification in the outbox, so a step is sent once however many
replicas or restarts see its timer, and no step follows an acknowledgement. The same logic serves every chat
platform; each person carries their id per platform.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.change import Change
from handlers.jobs import Job, JobState
from handlers.messages import Notify, PageStep
from handlers.notes import Paged, PagerCall, ResumeFailedPage
from handlers.pagers import TOOLS, triggers  # paging tools a step may name: the page opens there too

ROLES = ("primary", "secondary")
EVERYONE = ("channel", "here")
Everyone = Literal["channel", "here"]


class Person(BaseModel):
    """One on-call engineer, with the ids each chat platform mentions them by."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    slack: str | None = Field(default=None, pattern=r"^[US][A-Z0-9]{2,30}$")  # a user (U…) or user group (S…)
    dingtalk: str | None = Field(default=None, max_length=64)  # a DingTalk userId
    mobile: str | None = Field(default=None, pattern=r"^\+?[0-9]{6,20}$")  # DingTalk can @ by mobile too
    console: str | None = Field(default=None, max_length=64)  # a console user (``finetune-bot chat``)

    def platform_ids(self) -> list[str]:
        """The ``platform:id`` users this person is (what permissions compare with who typed a command)."""
        ids = {"slack": self.slack, "dingtalk": self.dingtalk, "console": self.console}
        return [f"{platform}:{value}" for platform, value in ids.items() if value]


class LadderStep(BaseModel):
    """Notify ``notify`` (roles, people, ``channel``, ``here``, ``pagerduty``, ``opsgenie``) ``after_minutes``
    after the page opened."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    after_minutes: float = Field(ge=0, le=7 * 24 * 60)
    notify: list[str] = Field(min_length=1)


DEFAULT_LADDER = (
    LadderStep(after_minutes=0, notify=["primary"]),
    LadderStep(after_minutes=5, notify=["primary", "secondary"]),
    LadderStep(after_minutes=15, notify=["channel"]),
)


class OnCall(BaseModel):
    """The ``oncall:`` section of the config. With nobody on the rota, a step that names no one says @here."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    people: dict[str, Person] = Field(default_factory=dict)
    rota: list[list[str]] = Field(default_factory=list)  # one shift per entry: [primary, secondary, …]
    shift_hours: float = Field(default=168, gt=0)
    rota_starts: datetime = datetime(2026, 1, 5, 9, tzinfo=UTC)  # a Monday, 09:00 UTC
    ladder: list[LadderStep] = Field(default_factory=lambda: list(DEFAULT_LADDER), min_length=1)
    repeat_every_minutes: float | None = Field(default=15, gt=0)
    max_repeats: int = Field(default=3, ge=0, le=100)

    @model_validator(mode="after")
    def _consistent(self) -> OnCall:
        for shift in self.rota:
            if not shift:
                raise ValueError("a rota shift names at least a primary")
            unknown = [name for name in shift if name not in self.people]
            if unknown:
                raise ValueError(f"rota names {', '.join(unknown)}, who are not in people")
        for step in self.ladder:
            known = (*ROLES, *EVERYONE, *TOOLS)
            unknown = [t for t in step.notify if t not in self.people and t not in known]
            if unknown:
                raise ValueError(
                    f"ladder step names {', '.join(unknown)}: use primary, secondary, channel, here, pagerduty, "
                    "opsgenie or a person"
                )
        delays = [step.after_minutes for step in self.ladder]
        if delays != sorted(delays):
            raise ValueError("ladder steps must come in order of after_minutes")
        return self

    @property
    def tools(self) -> list[str]:
        """The paging tools some step names (each needs its key configured)."""
        return [tool for tool in TOOLS if any(tool in step.notify for step in self.ladder)]

    @property
    def steps(self) -> int:
        """How many steps a page has in all, repeats included."""
        return len(self.ladder) + (self.max_repeats if self.repeat_every_minutes else 0)


def on_shift(oncall: OnCall, now: datetime) -> list[str]:
    """The names on shift at ``now``: primary first, then secondary (empty with no rota)."""
    if not oncall.rota:
        return []
    shifts = (now - oncall.rota_starts) // timedelta(hours=oncall.shift_hours)
    return list(oncall.rota[shifts % len(oncall.rota)])


def named_ids(oncall: OnCall, names: list[str]) -> list[str]:
    """The ``platform:id`` users of the people ``names`` (unknown names: none)."""
    return [user for name in names if name in oncall.people for user in oncall.people[name].platform_ids()]


def on_call_now(oncall: OnCall, now: datetime) -> set[str]:
    """The ``platform:id`` users on shift at ``now`` (primary, secondary, …): a page of theirs is theirs too."""
    return set(named_ids(oncall, on_shift(oncall, now)))


def step_due(oncall: OnCall, opened_at: datetime, step: int) -> datetime:
    last = len(oncall.ladder) - 1
    if step <= last:
        return opened_at + timedelta(minutes=oncall.ladder[step].after_minutes)
    repeat = timedelta(minutes=oncall.repeat_every_minutes or 0)
    return opened_at + timedelta(minutes=oncall.ladder[last].after_minutes) + repeat * (step - last)


def step_targets(oncall: OnCall, step: int, now: datetime) -> tuple[list[Paged], Everyone | None]:
    """Whom step ``step`` mentions (each with their platform ids), and whether it calls the whole channel."""
    ladder_step = oncall.ladder[min(step, len(oncall.ladder) - 1)]
    shift = on_shift(oncall, now)
    names: list[str] = []
    everyone: Everyone | None = None
    for target in ladder_step.notify:
        if target in ROLES:
            index = ROLES.index(target)
            if index < len(shift):
                names.append(shift[index])
        elif target == "channel" or (target == "here" and everyone is None):
            everyone = "channel" if target == "channel" else "here"
        elif target not in EVERYONE and target not in TOOLS:
            names.append(target)
    mention = [
        Paged(name=name, **oncall.people[name].model_dump(exclude={"console"})) for name in dict.fromkeys(names)
    ]
    if not mention and everyone is None and not step_tools(oncall, step):
        everyone = "here"  # a page that mentions no one notifies no one (a paging tool notifies its on-call)
    return mention, everyone


def step_tools(oncall: OnCall, step: int) -> list[str]:
    """The paging tools step ``step`` names."""
    return [target for target in oncall.ladder[min(step, len(oncall.ladder) - 1)].notify if target in TOOLS]


def open_page(job: Job, now: datetime) -> PageStep:
    """The first step of the page just opened on ``job``: due at once."""
    return PageStep(job_id=job.id, attempt=job.attempt, step=0, due=now)


def page_step(job: Job, message: PageStep, oncall: OnCall, now: datetime) -> Change:
    """Send step ``message.step`` of the job's page, unless it was acknowledged, closed or already sent."""
    page = job.page
    why = None
    if page is None or job.state is not JobState.RESUME_FAILED or page.attempt != message.attempt:
        why = "the page is closed"
    elif page.acked_by:
        why = f"acknowledged by {page.acked_by}"
    elif message.step != page.sent:
        why = f"step {message.step} is not next (sent {page.sent})"
    elif message.step >= oncall.steps:
        why = "the ladder is exhausted"
    if why is not None or page is None:
        history = {"event": "ignored", "what": "page-step", "step": message.step, "why": why}
        return Change(job, {**history, "state": job.state.value})
    mention, everyone = step_targets(oncall, message.step, now)
    named = list(dict.fromkeys([*page.named, *named_ids(oncall, [person.name for person in mention])]))
    stepped = page.model_copy(update={"sent": page.sent + 1, "named": named})
    opened, calls = triggers(job, stepped, step_tools(oncall, message.step))
    paged = job.model_copy(update={"page": opened, "updated_at": now})
    detail = page.detail if message.step == 0 else {}  # the first step says what failed; the later ones repeat
    told = ResumeFailedPage(
        reason=page.reason,
        step=message.step,
        steps=oncall.steps,
        mention=mention,
        everyone=everyone,
        log_tail=detail.get("log_tail") or [],
        exit_code=detail.get("exit_code"),
    )
    outbox: list[Notify | PageStep] = [Notify(job_id=job.id, channel="page", note=told), *calls]
    if message.step + 1 < oncall.steps:
        due = step_due(oncall, page.opened_at, message.step + 1)
        outbox.append(PageStep(job_id=job.id, attempt=page.attempt, step=message.step + 1, due=due))
    history = {
        "event": "page",
        "step": message.step,
        "notified": [person.name for person in mention]
        + ([f"@{everyone}"] if everyone else [])
        + [call.note.tool for call in calls if isinstance(call.note, PagerCall)],
        "state": job.state.value,
    }
    return Change(paged, history, list(outbox))
