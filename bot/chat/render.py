"""Turn a job into a card and its events into messages, platform-neutral: fields and short sentences.

The console prints them as text; Slack and DingTalk adapters lay the same card fields out as Block Kit and
interactive cards. Every word comes from :mod:`bot.chat.catalog` in the channel's language (English unless
the adapter asks for another), so no sentence is written here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from bot.chat.catalog import Lang, person, plain, say, text, word
from handlers.failures import Failure
from handlers.gang import rank_of
from handlers.job_cost import job_cost
from handlers.jobs import Attempt, Job, JobState
from handlers.messages import Notify
from handlers.notes import (
    Acked,
    CardRefresh,
    ChartNote,
    CompletedNote,
    FailedNote,
    GroupReleased,
    HeldStep,
    HungNote,
    InstanceGone,
    InstanceReleased,
    InterruptedNote,
    InterruptionWarning,
    InterruptTestDone,
    InterruptTestFailed,
    InterruptTestStarted,
    NoReports,
    NoticeBudgetNote,
    PagerCall,
    Rebalance,
    RebalanceCheckpoint,
    RelaunchPaused,
    Resumed,
    ResumeFailedPage,
    ResumeRequested,
    SpotPolicyNote,
    Stopped,
    StopRequested,
    WarnedBeforeStart,
)
from handlers.notice_budget import notice_budget
from handlers.pagers import TOOL_NAMES
from handlers.recipes import Recipe
from handlers.reports import Late

MiB = 1024 * 1024
BAR_CELLS, BAR_FILLED, BAR_EMPTY = 10, "▰", "▱"  # the card's progress bar: the same in every language

STATE_ICON = {
    JobState.PENDING: "⏳",
    JobState.PROVISIONING: "🚀",
    JobState.RUNNING: "🟢",
    JobState.INTERRUPTED: "⚠️",
    JobState.RECOVERING: "🔄",
    JobState.STOPPING: "⏹️",
    JobState.STOPPED: "⏹️",
    JobState.SUCCEEDED: "✅",
    JobState.FAILED: "❌",
    JobState.RESUME_FAILED: "🚨",
}


@dataclass(frozen=True, slots=True)
class Card:
    title: str
    fields: list[tuple[str, str]]


def card(job: Job, now: datetime, lang: Lang = "en") -> Card:
    current = job.current
    fields: list[tuple[str, str]] = [(text(lang, "label.state"), state_text(job.state, lang))]
    if job.nodes > 1:
        fields.extend(_gang_fields(job, lang))
    elif current is not None:
        where = " · ".join(part for part in (current.instance_id, current.instance_type, current.zone) if part)
        instance = text(
            lang,
            "card.instance",
            where=where or text(lang, "card.launching"),
            market=text(lang, f"market.{current.market}"),
            attempt=current.number,
        )
        fields.append((text(lang, "label.instance"), instance))
        if current.price_per_hour is not None:
            fields.append((text(lang, "label.price"), text(lang, "card.price", price=current.price_per_hour)))
    if job.standby is not None:  # a switch of market launched ahead: the job moves once it is up
        ahead = job.standby
        where = " · ".join(part for part in (ahead.instance_id, ahead.instance_type, ahead.zone) if part)
        market = text(lang, f"market.{ahead.market}")
        standby = text(lang, "card.standby", where=where or text(lang, "card.launching"), market=market)
        fields.append((text(lang, "label.standby"), standby))
    if job.step is not None:
        progress = f"{job.step}/{job.total_steps}" if job.total_steps else str(job.step)
        if job.total_steps:
            done = min(max(job.step / job.total_steps, 0.0), 1.0)
            progress = text(lang, "card.progress", bar=progress_bar(done), percent=done, steps=progress)
        loss = text(lang, "card.loss", loss=job.loss) if job.loss is not None else ""
        fields.append((text(lang, "label.step"), progress + loss))
        eta = _eta(job, now, lang) if job.state is JobState.RUNNING else None
        if eta:
            fields.append((text(lang, "label.eta"), eta))
    cost = job_cost(job, now)
    if cost.hours > 0:
        saving = text(lang, "card.saving", savings=cost.savings) if cost.savings is not None else ""
        egress = text(lang, "card.egress", egress=cost.egress) if cost.egress > 0 else ""
        paid = text(lang, "card.cost", paid=cost.paid, egress=egress, saving=saving)
        fields.append((text(lang, "label.cost"), paid))
    if job.checkpoint is not None:
        checkpoint = text(lang, "card.checkpoint", step=job.checkpoint.step, uri=job.checkpoint.uri)
        fields.append((text(lang, "label.checkpoint"), checkpoint))
    budget = notice_budget(job)
    if budget is not None:
        said = "card.notice-budget" if budget.fits else "card.notice-budget.short"
        shown = text(lang, said, commit=_about(budget.commit_seconds), notice=_about(budget.notice_seconds))
        fields.append((text(lang, "label.notice-budget"), shown))
    if job.interruptions:
        interruptions = text(
            lang,
            "card.interruptions",
            count=job.interruptions,
            lost=lost_text(job.steps_lost, job.steps_lost_unknown, lang),
            downtime=job.downtime_seconds,
        )
        fields.append((text(lang, "label.interruptions"), interruptions))
    if job.failure and job.state in (JobState.FAILED, JobState.RESUME_FAILED):
        fields.append((text(lang, "label.problem"), failure_text(job.failure, lang)))
    fields.extend(_plan_fields(job, lang))
    if job.page is not None and job.page.acked_by:
        acked = text(lang, "card.acked", by=person(job.page.acked_by), at=_time(job.page.acked_at, lang))
        fields.append((text(lang, "label.on-call"), acked))
    elif job.page is not None:
        fields.append((text(lang, "label.on-call"), text(lang, "card.paged", sent=job.page.sent)))
    return Card(title=text(lang, "card.title", job=job.id, recipe=job.recipe), fields=fields)


def _gang_fields(job: Job, lang: Lang) -> list[tuple[str, str]]:
    """A gang's card: its size, zone and generation, each live node's instance, and what they all pay per hour."""
    nodes = job.gang_attempts
    if not nodes:  # the gang ended: its last node of each rank
        last: dict[int, Attempt] = {}
        for attempt in job.attempts:
            rank = rank_of(attempt)
            if rank is not None:
                last[rank] = attempt
        nodes = dict(sorted(last.items()))
    zone = next((attempt.zone for attempt in nodes.values() if attempt.zone), None)
    gang = text(lang, "card.gang", nodes=job.nodes, zone=zone or "?", generation=job.generation)
    fields: list[tuple[str, str]] = [(text(lang, "label.nodes"), gang)]
    for rank, attempt in nodes.items():
        where = " · ".join(part for part in (attempt.instance_id, attempt.instance_type) if part)
        node = text(
            lang,
            "card.instance",
            where=where or text(lang, "card.launching"),
            market=text(lang, f"market.{attempt.market}"),
            attempt=attempt.number,
        )
        fields.append((text(lang, "label.node", rank=rank), node))
    prices = [attempt.price_per_hour for attempt in nodes.values() if attempt.price_per_hour is not None]
    if prices:
        fields.append((text(lang, "label.price"), text(lang, "card.price", price=sum(prices))))
    return fields


def _plan_fields(job: Job, lang: Lang) -> list[tuple[str, str]]:
    """The job's deadline and budget, and the spot policy's latest choice with its reason and projection."""
    fields: list[tuple[str, str]] = []
    if job.deadline is not None:
        fields.append((text(lang, "label.deadline"), text(lang, "card.deadline", at=job.deadline)))
    if job.budget is not None:
        fields.append((text(lang, "label.budget"), text(lang, "card.budget", budget=job.budget)))
    plan = job.plan
    if plan is None:
        return fields
    projection = ""
    if plan.finish is not None and plan.cost is not None:
        projection = text(lang, "card.plan.projection", finish=plan.finish, cost=plan.cost)
    elif plan.cost is not None:
        projection = text(lang, "card.plan.cost", cost=plan.cost)
    reason = policy_reason(lang, plan.reason, plan.values)
    fields.append((text(lang, "label.plan"), text(lang, "card.plan", reason=reason, projection=projection)))
    return fields


def policy_reason(lang: Lang, key: str, values: Mapping[str, Any]) -> str:
    """The spot policy's reason (stored as a catalogue key and values) in ``lang``; the key itself if unknown."""
    try:
        return text(lang, key, **values)
    except (KeyError, ValueError, IndexError):
        return key


def card_text(job: Job, now: datetime, lang: Lang = "en") -> str:
    shown = card(job, now, lang)
    return shown.title + "\n" + "\n".join(f"  {label}: {value}" for label, value in shown.fields)


def state_text(state: JobState, lang: Lang = "en") -> str:
    return f"{STATE_ICON[state]} {text(lang, f'state.{state.value}')}"


def message_text(job: Job, notify: Notify, now: datetime, lang: Lang = "en") -> str:
    """One sentence (or a few lines) for a thread message, an alert or a page: the note's type picks the words."""
    return _WORDS[type(notify.note)](job, notify.note, now, lang)


def _warning(job: Job, note: InterruptionWarning, now: datetime, lang: Lang) -> str:
    deadline = _time(note.deadline, lang)
    instance = instance_where(job, note.instance, lang)
    return text(lang, "note.interruption-warning", job=job.id, instance=instance, source=note.source, deadline=deadline)


def instance_where(job: Job, instance: str | None, lang: Lang) -> str | None:
    """``instance`` with its zone, which names its region too (``i-0ab… in us-west-2b``), when the job knows it."""
    if instance is None:
        return None
    attempts = [*job.attempts, *([job.standby] if job.standby is not None else [])]
    zone = next((attempt.zone for attempt in attempts if attempt.instance_id == instance and attempt.zone), None)
    return text(lang, "note.instance-in-zone", instance=instance, zone=zone) if zone else instance


def _early_signal(job: Job, note: Rebalance, now: datetime, lang: Lang) -> str:
    """What the early signal was, then what the spot authority did about it (nothing more than the checkpoint: no
    tail)."""
    if note.signal == "scheduled-event":
        # A day or two ahead: the date counts, as on the card's deadline.
        due = text(lang, "card.deadline", at=note.due.astimezone(UTC)) if note.due else text(lang, "time.unknown")
        head = text(lang, "note.scheduled-event", event=note.event or "?", due=due)
    else:
        head = text(lang, "note.rebalance")
    if note.action == "commit" or note.left_minutes is None or note.restart_minutes is None:
        return head
    return head + text(lang, f"note.early.{note.action}", left=note.left_minutes, restart=note.restart_minutes)


def _interrupted(job: Job, note: InterruptedNote, now: datetime, lang: Lang) -> str:
    timing = text(lang, "list.separator").join(
        text(lang, "timing.item", name=word(lang, f"phase.{name}", name), seconds=value)
        for name, value in note.seconds.items()
    )
    if note.saved_in_time and note.step is not None:
        return text(lang, "note.interrupted.saved", step=note.step, timing=timing)
    cause = late_text(note.late, lang)
    if note.lost is not None and note.reached is not None:
        lost = text(lang, "note.interrupted.lost", lost=note.lost, reached=note.reached)
    else:
        lost = text(lang, "note.interrupted.lost-unknown")
    if note.step is None:
        return text(lang, "note.interrupted.nothing", cause=cause, timing=timing, lost=lost)
    return text(lang, "note.interrupted.late", step=note.step, cause=cause, timing=timing, lost=lost)


def lost_text(lost: int, unknown: bool, lang: Lang) -> str:
    """Steps lost, as said: a count, "unknown" (a trainer whose step the runner could not see), never a made-up 0."""
    if not unknown:
        return text(lang, "lost.count", lost=lost)
    return text(lang, "lost.at-least", lost=lost) if lost else text(lang, "lost.unknown")


def late_text(late: Late | None, lang: Lang) -> str:
    """Why the newest work of an interrupted attempt did not make it, from the runner's codes."""
    if late is None:
        return text(lang, "late.unknown")
    if late.cause == "not-asked":
        why = text(
            lang,
            f"late.why.{late.why or 'no-rate'}",
            step=late.step,
            need=late.need_seconds or 0.0,
            left=late.left_seconds or 0.0,
        )
        return text(lang, "late.not-asked", why=why)
    return text(lang, f"late.{late.cause}", step=late.step, error=late.error)


def failure_text(failure: Failure, lang: Lang) -> str:
    """Why a job failed, in ``lang``, from the catalogue."""
    return say(lang, failure.reason())


def _resumed(job: Job, note: Resumed, now: datetime, lang: Lang) -> str:
    start = text(lang, "note.resumed.from-start" if note.step is None else "note.resumed.from-step", step=note.step)
    return text(
        lang,
        "note.resumed",
        attempt=note.attempt,
        zone=note.zone or text(lang, "note.resumed.new-zone"),
        start=start,
        lost=lost_text(note.lost or 0, note.lost is None, lang),
        downtime=note.downtime,
        skipped=text(lang, "note.resumed.skipped", count=note.skipped) if note.skipped else "",
    )


def _held_step(note: HeldStep, lang: Lang) -> str:
    """The survivors' step and, per lost node, the rule its part was rebuilt by."""
    parts = []
    for part, rule in sorted(note.rebuilt.items()):
        node = part.removeprefix("node-")
        if rule.startswith("checkpoint-"):
            parts.append(text(lang, "note.held-step.from-part", node=node, step=rule.removeprefix("checkpoint-")))
        else:
            parts.append(text(lang, "note.held-step.derived", node=node))
    return text(lang, "note.held-step", node=note.node, step=note.step, rebuilt="; ".join(parts))


def chart_caption(job: Job, now: datetime, lang: Lang) -> str:
    """What is posted with the job's chart (and, where no image can go, instead of it)."""
    progress = f"{job.step or 0}/{job.total_steps}" if job.total_steps else str(job.step or 0)
    paid = job_cost(job, now).paid
    return text(lang, "note.chart", job=job.id, progress=progress, interruptions=job.interruptions, paid=paid)


def _completed(job: Job, note: CompletedNote, now: datetime, lang: Lang) -> str:
    cost = job_cost(job, now)
    saving = text(lang, "note.completed.saving", savings=cost.savings) if cost.savings is not None else ""
    return text(
        lang,
        "note.completed",
        job=job.id,
        attempts=len(job.attempts),
        interruptions=job.interruptions,
        lost=lost_text(job.steps_lost, job.steps_lost_unknown, lang),
        downtime=job.downtime_seconds,
        paid=cost.paid,
        saving=saving,
        output=note.output_uri,
    )


def _failed(job: Job, note: FailedNote, now: datetime, lang: Lang) -> str:
    # Outside the catalogue's filling: the lines were cleaned where the report entered (handlers/reports.py), and
    # lose any person marker here all the same, so a trainer's output can never become a mention.
    tail = "\n".join(f"    {plain(line)}" for line in note.log_tail[-5:])
    reason = failure_text(note.reason, lang)
    return text(lang, "note.failed", job=job.id, reason=reason) + (f"\n{tail}" if tail else "")


def _page(job: Job, note: ResumeFailedPage, now: datetime, lang: Lang) -> str:
    # A later step of the on-call ladder says which it is.
    again = text(lang, "note.resume-failed.again", number=note.step + 1, steps=note.steps) if note.step else ""
    return text(lang, "note.resume-failed", again=again, job=job.id, reason=failure_text(note.reason, lang))


def _acked(job: Job, note: Acked, now: datetime, lang: Lang) -> str:
    if note.via is None:
        return text(lang, "note.acked", by=person(note.by), job=job.id, at=_time(note.at, lang))
    tool = TOOL_NAMES[note.via]
    return text(lang, "note.acked.via", by=person(note.by), job=job.id, at=_time(note.at, lang), tool=tool)


def _pager_call(job: Job, note: PagerCall, now: datetime, lang: Lang) -> str:
    """The summary a paging tool shows for the call (the chat posts none)."""
    reason = failure_text(note.reason, lang) if note.reason is not None else ""
    return text(lang, f"note.pager-call.{note.action}", job=job.id, reason=reason, by=note.by or "")


def _stopped(job: Job, note: Stopped, now: datetime, lang: Lang) -> str:
    if note.step is None:
        return text(lang, "note.stopped", job=job.id)
    return text(lang, "note.stopped.kept", job=job.id, step=note.step)


def _test_done(job: Job, note: InterruptTestDone, now: datetime, lang: Lang) -> str:
    result = note.result
    return text(
        lang,
        f"note.interrupt-test-done.{result.way}",
        instance=result.instance_id,
        reference=result.reference or "",
        at=_time(result.reclaim_at, lang),
        seconds=result.after_seconds or 0.0,
    )


def _released(job: Job, note: InstanceReleased | GroupReleased, now: datetime, lang: Lang) -> str:
    values: dict[str, Any] = dict(note.values)
    if "state" in values:  # a job state, in the channel's words
        values["state"] = word(lang, f"state.{values['state']}", str(values["state"]))
    why = text(lang, f"reconcile.{note.why}", **values)
    if isinstance(note, GroupReleased):
        return text(lang, "note.group-released", group=note.group, why=why)
    return text(lang, "note.instance-released", instance=note.instance, why=why)


def _hung(job: Job, note: HungNote, now: datetime, lang: Lang) -> str:
    # The frames are the trainer's (cleaned where the report entered) and lose any person marker here all the same.
    if note.then == "restart" and note.restart_from is not None:
        then = text(lang, "note.hung.restart", step=note.restart_from)
    else:
        then = text(lang, "note.hung.restart-start" if note.then == "restart" else f"note.hung.{note.then}")
    frames = "".join(
        text(lang, "note.hung.frame", function=plain(frame.function), file=plain(frame.file), line=frame.line)
        for frame in note.frames
    )
    frames = text(lang, "note.hung.frames") + frames if frames else text(lang, "note.hung.no-stacks")
    step = note.step if note.step is not None else "?"
    return text(lang, "note.hung", step=step, seconds=note.seconds, limit=note.limit, then=then, frames=frames)


def _notice_budget(job: Job, note: NoticeBudgetNote, now: datetime, lang: Lang) -> str:
    rate = (
        text(lang, "note.notice-budget.rate", mib_per_second=note.bytes_per_second / MiB)
        if note.bytes_per_second
        else text(lang, "note.notice-budget.no-rate")
    )
    return text(
        lang,
        "note.notice-budget",
        commit=_about(note.commit_seconds),
        save=_about(note.save_seconds),
        mib=note.bytes / MiB,
        rate=rate,
        notice=_about(note.notice_seconds),
    )


def _about(seconds: float) -> str:
    """Seconds as the card and the thread say them: a tenth below ten, whole ones above."""
    return f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"


def _card(job: Job, note: CardRefresh, now: datetime, lang: Lang) -> str:
    return card_text(job, now, lang)  # a card note is drawn as the card; said here only if an adapter asks


_Words = Callable[[Job, Any, datetime, Lang], str]
# One entry per note type; the catalogue test renders every type of the union, so a missing one fails there.
_WORDS: dict[type[BaseModel], _Words] = {
    CardRefresh: _card,
    InterruptionWarning: _warning,
    InterruptedNote: _interrupted,
    Resumed: _resumed,
    Rebalance: _early_signal,
    WarnedBeforeStart: lambda job, note, now, lang: text(
        lang, "note.warned-before-start", instance=instance_where(job, note.instance, lang), source=note.source
    ),
    RebalanceCheckpoint: lambda job, note, now, lang: text(
        lang, "note.rebalance-checkpoint", step=note.step, seconds=note.seconds
    ),
    NoticeBudgetNote: _notice_budget,
    InstanceGone: lambda job, note, now, lang: text(lang, "note.instance-gone", instance=note.instance),
    HeldStep: lambda job, note, now, lang: _held_step(note, lang),
    SpotPolicyNote: lambda job, note, now, lang: text(
        lang, "note.spot-policy", reason=policy_reason(lang, note.reason, note.values)
    ),
    InstanceReleased: _released,
    GroupReleased: _released,
    NoReports: lambda job, note, now, lang: text(
        lang, "note.no-reports", job=job.id, minutes=note.minutes, instance=note.instance
    ),
    RelaunchPaused: lambda job, note, now, lang: text(
        lang, "note.relaunch-paused", attempt=note.attempt, count=note.count, limit=note.limit, seconds=note.seconds
    ),
    HungNote: _hung,
    CompletedNote: _completed,
    FailedNote: _failed,
    ChartNote: lambda job, note, now, lang: chart_caption(job, now, lang),
    Stopped: _stopped,
    ResumeFailedPage: _page,
    Acked: _acked,
    PagerCall: _pager_call,
    StopRequested: lambda job, note, now, lang: text(lang, "note.stop-requested", by=person(note.by)),
    ResumeRequested: lambda job, note, now, lang: text(
        lang, "note.resume-requested", by=person(note.by), job=job.id, market=text(lang, f"market.{note.market}")
    ),
    InterruptTestStarted: lambda job, note, now, lang: text(
        lang, "note.interrupt-test-started", instance=note.instance, by=person(note.by)
    ),
    InterruptTestDone: _test_done,
    InterruptTestFailed: lambda job, note, now, lang: text(
        lang, "note.interrupt-test-failed", job=job.id, error=note.error
    ),
}


def recipes_text(recipes: Iterable[Recipe], lang: Lang = "en") -> str:
    """The recipes part of ``help``: each recipe with its parameters, their defaults, types and bounds."""
    lines = [text(lang, "help.recipes")]
    for recipe in sorted(recipes, key=lambda recipe: recipe.name):
        lines.append(text(lang, "help.recipe", name=recipe.name, description=recipe.description))
        if not recipe.parameters:
            lines.append(text(lang, "help.no-parameters"))
        for name, spec in recipe.parameters.items():
            bounds = ""
            if spec.choices:
                bounds = text(lang, "help.choices", choices=", ".join(spec.choices))
            elif spec.allow:
                bounds = text(lang, "help.allowed", forms=spec.allowed_forms())
            elif spec.min is not None or spec.max is not None:
                bounds = text(lang, "help.range", low=_bound(spec.min), high=_bound(spec.max))
            said = text(lang, "help.parameter-help", text=spec.help) if spec.help else ""
            default = str(spec.default).lower() if isinstance(spec.default, bool) else spec.default
            lines.append(
                text(lang, "help.parameter", name=name, default=default, type=spec.type, range=bounds, help=said)
            )
    return "\n".join(lines)


def _bound(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if value == int(value) else f"{value:g}"


def mentions(page: ResumeFailedPage) -> str:
    """The people a page step calls, as plain ``@name`` words (chat adapters use their own mention syntax)."""
    names = [f"@{person.name}" for person in page.mention]
    if page.everyone:
        names.append(f"@{page.everyone}")
    return " ".join(names) + " " if names else ""


def progress_bar(done: float, cells: int = BAR_CELLS) -> str:
    """``done`` (0 to 1) as a bar of ``cells`` characters, filled to the cell it has reached (never full early)."""
    filled = min(int(done * cells), cells)
    return BAR_FILLED * filled + BAR_EMPTY * (cells - filled)


def _eta(job: Job, now: datetime, lang: Lang) -> str | None:
    current = job.current
    if current is None or current.started_at is None or not job.total_steps or job.step is None:
        return None
    done = job.step - (current.resumed_from_step or 0)
    elapsed = (now - current.started_at).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    remaining = (job.total_steps - job.step) * elapsed / done
    if remaining >= 2 * 3600:
        return text(lang, "card.eta.hours", hours=remaining / 3600)
    if remaining >= 90:
        return text(lang, "card.eta.minutes", minutes=remaining / 60)
    return text(lang, "card.eta.seconds", seconds=remaining)


def _time(value: datetime | None, lang: Lang) -> str:
    if value is None:
        return text(lang, "time.unknown")
    return value.strftime(text(lang, "time.format"))
