"""Turn a job into a card and its events into messages, platform-neutral: fields and short sentences.

The console prints them as text; Slack and DingTalk adapters lay the same card fields out as Block Kit and
interactive cards.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from handlers.cost import job_cost
from handlers.jobs import Job, JobState
from handlers.messages import Notify

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


def card(job: Job, now: datetime) -> Card:
    current = job.current
    fields: list[tuple[str, str]] = [("State", f"{STATE_ICON[job.state]} {job.state.value}")]
    if current is not None:
        where = " · ".join(part for part in (current.instance_id, current.instance_type, current.zone) if part)
        fields.append(("Instance", f"{where or 'launching…'} ({current.market}, attempt {current.number})"))
        if current.price_per_hour is not None:
            fields.append(("Price", f"${current.price_per_hour:.2f}/h"))
    if job.step is not None:
        progress = f"{job.step}/{job.total_steps}" if job.total_steps else str(job.step)
        fields.append(("Step", progress + (f" · loss {job.loss:.4f}" if job.loss is not None else "")))
        eta = _eta(job, now) if job.state is JobState.RUNNING else None
        if eta:
            fields.append(("ETA", eta))
    cost = job_cost(job, now)
    if cost.hours > 0:
        saving = f" · saving {cost.savings:.0%} vs on-demand" if cost.savings is not None else ""
        fields.append(("Cost", f"${cost.paid:.4f}{saving}"))
    if job.checkpoint is not None:
        fields.append(("Checkpoint", f"step {job.checkpoint.step} · {job.checkpoint.uri}"))
    if job.interruptions:
        fields.append(
            (
                "Interruptions",
                f"{job.interruptions} · {job.steps_lost} steps lost · {job.downtime_seconds:.0f}s downtime",
            )
        )
    if job.failure and job.state in (JobState.FAILED, JobState.RESUME_FAILED):
        fields.append(("Problem", job.failure))
    if job.page is not None and job.page.acked_by:
        fields.append(("On-call", f"acknowledged by {job.page.acked_by} at {_time(job.page.acked_at)}"))
    elif job.page is not None:
        fields.append(("On-call", f"paged {job.page.sent} time(s), not acknowledged yet"))
    return Card(title=f"{job.id} · {job.recipe}", fields=fields)


def card_text(job: Job, now: datetime) -> str:
    shown = card(job, now)
    return shown.title + "\n" + "\n".join(f"  {label}: {value}" for label, value in shown.fields)


def message_text(job: Job, note: Notify, now: datetime) -> str:
    """One sentence (or a few lines) for a thread message, an alert or a page."""
    f: dict[str, Any] = note.fields
    topic = note.topic
    if topic == "interruption-warning":
        return (
            f"⚠️ Spot interruption warning for {job.id} on {f.get('instance')} (from {f.get('source')}); "
            f"the machine goes at {_time(f.get('deadline'))}. Checkpointing now."
        )
    if topic == "interrupted":
        seconds = f.get("seconds") or {}
        timing = ", ".join(f"{name} {value:.1f}s" for name, value in seconds.items())
        saved = "saved before the deadline" if f.get("saved_in_time") else f"NOT saved in time ({f.get('note')})"
        return f"💾 Checkpoint at step {f.get('step')} {saved} ({timing}). Relaunching…"
    if topic == "resumed":
        lost = f.get("lost", 0)
        skipped = f.get("skipped") or []
        extra = f"; skipped {len(skipped)} invalid checkpoint(s)" if skipped else ""
        return (
            f"🔁 Resumed on attempt {f.get('attempt')} in {f.get('zone') or 'a new zone'} from step "
            f"{f.get('resumed_from_step')}: {lost} steps lost, {f.get('downtime', 0):.0f}s downtime{extra}."
        )
    if topic == "completed":
        cost = job_cost(job, now)
        saving = f", saved {cost.savings:.0%} against on-demand" if cost.savings is not None else ""
        return (
            f"✅ {job.id} finished: {len(job.attempts)} attempt(s), {job.interruptions} interruption(s), "
            f"{job.steps_lost} steps lost, {job.downtime_seconds:.0f}s downtime, cost ${cost.paid:.4f}"
            f"{saving}. Output: {f.get('output_uri')}"
        )
    if topic == "failed":
        tail = "\n".join(f"    {line}" for line in (f.get("log_tail") or [])[-5:])
        return f"❌ {job.id} failed: {f.get('reason')}" + (f"\n{tail}" if tail else "")
    if topic == "resume-failed":
        escalation = int(f.get("step") or 0)
        again = f" (escalation {escalation + 1} of {f.get('steps')}, not acknowledged yet)" if escalation else ""
        return (
            f"🚨 On-call{again}: {job.id} could not resume ({f.get('reason')}). "
            f"Reply `/finetune ack {job.id}`, then `resume {job.id}` or `resume {job.id} on-demand`, "
            f"or `stop {job.id}`."
        )
    if topic == "drill-started":
        return f"🧪 Interruption drill on {f.get('instance')} started by {f.get('by')}."
    if topic == "stop-requested":
        return f"⏹️ Stop requested by {f.get('by')}: checkpointing, then releasing the instance."
    if topic == "stopped":
        step = f.get("step")
        return f"⏹️ {job.id} stopped" + (f"; checkpoint at step {step} kept." if step is not None else ".")
    if topic == "acked":
        return f"👀 {f.get('by')} acknowledged the page for {job.id} at {_time(f.get('at'))}; the escalation stops."
    if topic == "resume-requested":
        return f"🔁 {f.get('by')} asked to resume {job.id} on {f.get('market')}."
    if topic == "rebalance":
        return "↔️ Rebalance recommendation: the instance is at elevated risk; checkpointing early."
    if topic == "rebalance-checkpoint":
        return f"💾 Early checkpoint at step {f.get('step')} committed in {f.get('seconds', 0):.1f}s."
    if topic == "instance-gone":
        return f"⚠️ Instance {f.get('instance')} went away without notice; relaunching from the last checkpoint."
    if topic.endswith("-failed"):
        return f"⚠️ {topic.removesuffix('-failed')} failed for {job.id}: {f.get('reason')}"
    if topic.endswith("-done"):
        return f"ℹ️ {f.get('detail')}"
    return f"{job.id}: {topic}"


def mentions(note: Notify) -> str:
    """The people a page step calls, as plain ``@name`` words (chat adapters use their own mention syntax)."""
    names = [f"@{person.get('name')}" for person in note.fields.get("mention") or []]
    if note.fields.get("everyone"):
        names.append(f"@{note.fields['everyone']}")
    return " ".join(names) + " " if names else ""


def _eta(job: Job, now: datetime) -> str | None:
    current = job.current
    if current is None or current.started_at is None or not job.total_steps or job.step is None:
        return None
    done = job.step - (current.resumed_from_step or 0)
    elapsed = (now - current.started_at).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    remaining = (job.total_steps - job.step) * elapsed / done
    return f"{remaining / 60:.0f} min" if remaining >= 90 else f"{remaining:.0f}s"


def _time(value: Any) -> str:
    if not value:
        return "an unknown time"
    return datetime.fromisoformat(str(value)).strftime("%H:%M:%S UTC")
