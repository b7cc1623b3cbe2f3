"""Turn a job into a card and its events into messages, platform-neutral: fields and short sentences.

The console prints them as text; Slack and DingTalk adapters lay the same card fields out as Block Kit and
interactive cards. Every word comes from :mod:`bot.chat.catalog` in the channel's language (English unless
the adapter asks for another), so no sentence is written here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.chat.catalog import Lang, text, word
from handlers.cost import job_cost
from handlers.jobs import Job, JobState
from handlers.messages import Notify
from handlers.recipes import Recipe

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
    if current is not None:
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
    if job.step is not None:
        progress = f"{job.step}/{job.total_steps}" if job.total_steps else str(job.step)
        loss = text(lang, "card.loss", loss=job.loss) if job.loss is not None else ""
        fields.append((text(lang, "label.step"), progress + loss))
        eta = _eta(job, now, lang) if job.state is JobState.RUNNING else None
        if eta:
            fields.append((text(lang, "label.eta"), eta))
    cost = job_cost(job, now)
    if cost.hours > 0:
        saving = text(lang, "card.saving", savings=cost.savings) if cost.savings is not None else ""
        fields.append((text(lang, "label.cost"), text(lang, "card.cost", paid=cost.paid, saving=saving)))
    if job.checkpoint is not None:
        checkpoint = text(lang, "card.checkpoint", step=job.checkpoint.step, uri=job.checkpoint.uri)
        fields.append((text(lang, "label.checkpoint"), checkpoint))
    if job.interruptions:
        interruptions = text(
            lang,
            "card.interruptions",
            count=job.interruptions,
            lost=job.steps_lost,
            downtime=job.downtime_seconds,
        )
        fields.append((text(lang, "label.interruptions"), interruptions))
    if job.failure and job.state in (JobState.FAILED, JobState.RESUME_FAILED):
        fields.append((text(lang, "label.problem"), job.failure))
    fields.extend(_plan_fields(job, lang))
    if job.page is not None and job.page.acked_by:
        acked = text(lang, "card.acked", by=job.page.acked_by, at=_time(job.page.acked_at, lang))
        fields.append((text(lang, "label.on-call"), acked))
    elif job.page is not None:
        fields.append((text(lang, "label.on-call"), text(lang, "card.paged", sent=job.page.sent)))
    return Card(title=text(lang, "card.title", job=job.id, recipe=job.recipe), fields=fields)


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


def message_text(job: Job, note: Notify, now: datetime, lang: Lang = "en") -> str:
    """One sentence (or a few lines) for a thread message, an alert or a page."""
    f: dict[str, Any] = note.fields
    topic = note.topic
    if topic == "interruption-warning":
        return text(
            lang,
            "topic.interruption-warning",
            job=job.id,
            instance=f.get("instance"),
            source=f.get("source"),
            deadline=_time(f.get("deadline"), lang),
        )
    if topic == "interrupted":
        seconds = f.get("seconds") or {}
        timing = text(lang, "list.separator").join(
            text(lang, "timing.item", name=word(lang, f"phase.{name}", name), seconds=value)
            for name, value in seconds.items()
        )
        if f.get("saved_in_time"):
            return text(lang, "topic.interrupted.saved", step=f.get("step"), timing=timing)
        return text(lang, "topic.interrupted.late", step=f.get("step"), note=f.get("note"), timing=timing)
    if topic == "resumed":
        skipped = f.get("skipped") or []
        return text(
            lang,
            "topic.resumed",
            attempt=f.get("attempt"),
            zone=f.get("zone") or text(lang, "topic.resumed.new-zone"),
            step=f.get("resumed_from_step") or 0,  # a fresh start resumes from step 0
            lost=f.get("lost", 0),
            downtime=f.get("downtime", 0),
            skipped=text(lang, "topic.resumed.skipped", count=len(skipped)) if skipped else "",
        )
    if topic == "completed":
        cost = job_cost(job, now)
        saving = text(lang, "topic.completed.saving", savings=cost.savings) if cost.savings is not None else ""
        return text(
            lang,
            "topic.completed",
            job=job.id,
            attempts=len(job.attempts),
            interruptions=job.interruptions,
            lost=job.steps_lost,
            downtime=job.downtime_seconds,
            paid=cost.paid,
            saving=saving,
            output=f.get("output_uri"),
        )
    if topic == "failed":
        tail = "\n".join(f"    {line}" for line in (f.get("log_tail") or [])[-5:])
        return text(lang, "topic.failed", job=job.id, reason=f.get("reason")) + (f"\n{tail}" if tail else "")
    if topic == "resume-failed":
        escalation = int(f.get("step") or 0)  # a later step of the on-call ladder says which
        again = ""
        if escalation:
            again = text(lang, "topic.resume-failed.again", number=escalation + 1, steps=f.get("steps"))
        return text(lang, "topic.resume-failed", again=again, job=job.id, reason=f.get("reason"))
    if topic == "drill-started":
        return text(lang, "topic.drill-started", instance=f.get("instance"), by=f.get("by"))
    if topic == "stop-requested":
        return text(lang, "topic.stop-requested", by=f.get("by"))
    if topic == "stopped":
        step = f.get("step")
        if step is None:
            return text(lang, "topic.stopped", job=job.id)
        return text(lang, "topic.stopped.kept", job=job.id, step=step)
    if topic == "acked":
        return text(lang, "topic.acked", by=f.get("by"), job=job.id, at=_time(f.get("at"), lang))
    if topic == "resume-requested":
        market = f.get("market")
        shown = word(lang, f"market.{market}", str(market))
        return text(lang, "topic.resume-requested", by=f.get("by"), job=job.id, market=shown)
    if topic == "rebalance":
        return text(lang, "topic.rebalance")
    if topic == "rebalance-checkpoint":
        return text(lang, "topic.rebalance-checkpoint", step=f.get("step"), seconds=f.get("seconds", 0))
    if topic == "spot-policy":
        return text(lang, "topic.spot-policy", reason=policy_reason(lang, str(f.get("reason")), f.get("values") or {}))
    if topic == "instance-gone":
        return text(lang, "topic.instance-gone", instance=f.get("instance"))
    if topic in ("instance-released", "group-released"):
        values = dict(f.get("values") or {})
        if "state" in values:  # a job state, in the channel's words
            values["state"] = word(lang, f"state.{values['state']}", str(values["state"]))
        why = text(lang, f"reconcile.{f.get('why')}", **values)
        if topic == "group-released":
            return text(lang, "topic.group-released", group=f.get("group"), why=why)
        return text(lang, "topic.instance-released", instance=f.get("instance"), why=why)
    if topic == "no-reports":
        return text(lang, "topic.no-reports", job=job.id, minutes=f.get("minutes"), instance=f.get("instance"))
    if topic == "relaunch-paused":
        return text(
            lang,
            "topic.relaunch-paused",
            attempt=f.get("attempt"),
            count=f.get("count"),
            limit=f.get("limit"),
            seconds=f.get("seconds", 0),
        )
    if topic.endswith("-failed"):
        what = topic.removesuffix("-failed")
        return text(
            lang, "topic.other-failed", what=word(lang, f"action.{what}", what), job=job.id, reason=f.get("reason")
        )
    if topic.endswith("-done"):
        return text(lang, "topic.other-done", detail=f.get("detail"))
    return text(lang, "topic.unknown", job=job.id, topic=topic)


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


def mentions(note: Notify) -> str:
    """The people a page step calls, as plain ``@name`` words (chat adapters use their own mention syntax)."""
    names = [f"@{person.get('name')}" for person in note.fields.get("mention") or []]
    if note.fields.get("everyone"):
        names.append(f"@{note.fields['everyone']}")
    return " ".join(names) + " " if names else ""


def _eta(job: Job, now: datetime, lang: Lang) -> str | None:
    current = job.current
    if current is None or current.started_at is None or not job.total_steps or job.step is None:
        return None
    done = job.step - (current.resumed_from_step or 0)
    elapsed = (now - current.started_at).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    remaining = (job.total_steps - job.step) * elapsed / done
    if remaining >= 90:
        return text(lang, "card.eta.minutes", minutes=remaining / 60)
    return text(lang, "card.eta.seconds", seconds=remaining)


def _time(value: Any, lang: Lang) -> str:
    if not value:
        return text(lang, "time.unknown")
    return datetime.fromisoformat(str(value)).strftime(text(lang, "time.format"))
