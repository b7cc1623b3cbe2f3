"""The stop: a person's (``/finetune stop``), or the spot policy's for a job's budget
(:mod:`handlers.decide.steering`); one module below both, so the policy stops a job the way a person does.
"""

from __future__ import annotations

from datetime import datetime

from handlers.change import Change
from handlers.decide import launching
from handlers.decide.builders import WORDING, change, ignore, notify
from handlers.jobs import Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import (
    Message,
    StopDeadline,
    StopRunner,
    Terminate,
)
from handlers.notes import (
    Stopped,
    StopRequested,
)
from handlers.pagers import resolutions
from handlers.transitions import next_state


def stop_command(job: Job, user: str, now: datetime, lifecycle: Lifecycle | None = None) -> Change:
    """Checkpoint, then release: the runner is asked to save and stop, with a deadline; a job with no live
    instance (between attempts, or its instance gone) is STOPPED at once with what was committed."""
    state = next_state(job.state, "stop")
    if job.state is JobState.STOPPING and job.switch_to is not None:
        # The policy's switch of market was under way: the checkpoint it waits for now ends the job instead.
        keeping = job.model_copy(update={"switch_to": None, "switch_zone": None})
        history = {"event": "stop", "by": user, "cancelled_switch": job.switch_to}
        return change(keeping, job.state, now, history, [notify(job, "thread", StopRequested(by=user))])
    if state is None:
        return ignore(job, "stop", WORDING("ignored.stop", state=job.state), by=user)
    current = job.current
    instance = current.instance_id if current is not None and current.ended_at is None else None
    outbox: list[Message] = [notify(job, "thread", StopRequested(by=user)), *resolutions(job, job.page)]
    job = job.model_copy(update={"page": None})  # a stop closes the page: nobody needs waking for it
    if job.nodes > 1:
        instance = next((a.instance_id for a in job.gang_attempts.values() if a.instance_id), None)
    if state is JobState.STOPPING and instance is None:  # nothing runs that could save a checkpoint
        state = next_state(job.state, "stop-no-instance") or JobState.STOPPED
    if state is JobState.STOPPING and instance:
        due = now + (lifecycle or Lifecycle()).stop_timeout
        runners = launching.stop_runners(job) if job.nodes > 1 else [StopRunner(job_id=job.id, instance_id=instance)]
        if job.nodes > 1:  # the nodes not launched yet end now: their launches in flight start nothing that stays
            job = launching.end_unlaunched(job, now, f"stopped by {user} before its launch")
        outbox.extend(runners)
        outbox.append(StopDeadline(job_id=job.id, attempt=job.attempt, due=due))
        return change(job, state, now, {"event": "stop", "by": user}, outbox)
    if job.nodes > 1:
        outbox.extend(launching.releases(job))
    elif instance:
        outbox.append(Terminate(job_id=job.id, instance_id=instance))
    ended = launching.end_attempt(job, now, f"stopped by {user}")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    outbox.append(notify(ended, "thread", Stopped(step=kept)))
    return change(ended, state, now, {"event": "stop", "by": user, "kept_step": kept}, outbox)
