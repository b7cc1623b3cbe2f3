"""The job state machine, as one explicit table.

A runner failure is ``failed`` on the first attempt and ``resume-failed`` on a later one: a resumed attempt
that cannot train pages on-call instead of quietly failing the job. The same split holds for a job that gives up
after too many attempts without progress (``no-progress-first`` / ``no-progress``). An event that is not in the
table for the job's current state is recorded in the job's history and ignored, never half-applied.
"""

from __future__ import annotations

from typing import Literal

from handlers.jobs import JobState as S

Trigger = Literal[
    "launched",
    "launch-failed",
    "started",
    "progress",
    "checkpoint",
    "rebalance",
    "spot-interruption",
    "warned-before-start",
    "interrupted",
    "instance-gone",
    "completed",
    "failed",
    "resume-failed",
    "start-timeout",
    "stop",
    "interrupt-test",
    "ack",
    "resume",
    "relaunch-due",
    "no-progress",
    "no-progress-first",
    "stop-no-instance",
    "stop-timeout",
    "stop-failed",
    "hung",
]

TRANSITIONS: dict[tuple[S, Trigger], S] = {
    (S.PENDING, "launched"): S.PROVISIONING,
    (S.PENDING, "launch-failed"): S.FAILED,
    # The runner's own reports prove the launch happened even when its result has not arrived (yet).
    (S.PENDING, "started"): S.RUNNING,
    (S.PENDING, "failed"): S.FAILED,
    (S.PENDING, "start-timeout"): S.FAILED,
    # A runner that finds the job's output committed reports ``completed`` at once, and a replica's death can hold
    # its ``started`` back: the job is done, whatever the bot had heard of that attempt so far.
    (S.PENDING, "completed"): S.SUCCEEDED,
    (S.PENDING, "stop"): S.STOPPED,
    # A gang's later node refused (not for capacity) after node 0 launched: the gang cannot form.
    (S.PROVISIONING, "launch-failed"): S.FAILED,
    (S.PROVISIONING, "started"): S.RUNNING,
    (S.PROVISIONING, "failed"): S.FAILED,
    (S.PROVISIONING, "start-timeout"): S.FAILED,
    (S.PROVISIONING, "instance-gone"): S.RECOVERING,
    (S.PROVISIONING, "stop"): S.STOPPING,
    (S.PROVISIONING, "completed"): S.SUCCEEDED,
    # A spot warning for an instance whose runner has not started (launched, pulling its image, restoring): it will
    # not live to train; released and relaunched at once (handlers/decide/early_signals.py).
    (S.PROVISIONING, "warned-before-start"): S.RECOVERING,
    (S.RECOVERING, "warned-before-start"): S.RECOVERING,
    (S.RUNNING, "progress"): S.RUNNING,
    (S.RUNNING, "checkpoint"): S.RUNNING,
    (S.RUNNING, "rebalance"): S.RUNNING,
    (S.RUNNING, "interrupt-test"): S.RUNNING,
    (S.RUNNING, "spot-interruption"): S.INTERRUPTED,
    (S.RUNNING, "interrupted"): S.RECOVERING,
    (S.RUNNING, "instance-gone"): S.RECOVERING,
    (S.RUNNING, "completed"): S.SUCCEEDED,
    (S.RUNNING, "failed"): S.FAILED,
    (S.RUNNING, "resume-failed"): S.RESUME_FAILED,
    (S.RUNNING, "stop"): S.STOPPING,
    (S.INTERRUPTED, "progress"): S.INTERRUPTED,
    (S.INTERRUPTED, "checkpoint"): S.INTERRUPTED,
    (S.INTERRUPTED, "spot-interruption"): S.INTERRUPTED,
    (S.INTERRUPTED, "interrupted"): S.RECOVERING,
    (S.INTERRUPTED, "instance-gone"): S.RECOVERING,
    (S.INTERRUPTED, "failed"): S.RECOVERING,
    (S.INTERRUPTED, "resume-failed"): S.RECOVERING,
    (S.INTERRUPTED, "completed"): S.SUCCEEDED,
    (S.INTERRUPTED, "stop"): S.STOPPING,
    (S.RECOVERING, "launched"): S.RECOVERING,
    (S.RECOVERING, "started"): S.RUNNING,
    (S.RECOVERING, "launch-failed"): S.RESUME_FAILED,
    (S.RECOVERING, "failed"): S.RESUME_FAILED,
    (S.RECOVERING, "resume-failed"): S.RESUME_FAILED,
    (S.RECOVERING, "start-timeout"): S.RESUME_FAILED,
    (S.RECOVERING, "instance-gone"): S.RESUME_FAILED,
    (S.RECOVERING, "stop"): S.STOPPING,
    (S.RECOVERING, "completed"): S.SUCCEEDED,
    (S.STOPPING, "launched"): S.STOPPING,
    (S.STOPPING, "progress"): S.STOPPING,
    (S.STOPPING, "checkpoint"): S.STOPPING,
    (S.STOPPING, "interrupted"): S.STOPPED,
    (S.STOPPING, "instance-gone"): S.STOPPED,
    (S.STOPPING, "failed"): S.STOPPED,
    (S.STOPPING, "resume-failed"): S.STOPPED,
    (S.STOPPING, "completed"): S.SUCCEEDED,
    (S.RESUME_FAILED, "ack"): S.RESUME_FAILED,
    (S.RESUME_FAILED, "resume"): S.RECOVERING,
    (S.RESUME_FAILED, "stop"): S.STOPPED,
    # The attempt resumed, or finished, after all: its runner's reports came after the cloud's word that the
    # instance was gone (a replica died with them in flight, and the runner exits once its output is committed).
    # Its start is told and recorded; the job waits for on-call, or for its completion.
    (S.RESUME_FAILED, "started"): S.RESUME_FAILED,
    (S.RESUME_FAILED, "completed"): S.SUCCEEDED,
    (S.FAILED, "resume"): S.RECOVERING,
    (S.STOPPED, "resume"): S.RECOVERING,
    # Bounded relaunches (handlers/lifecycle.py): the held-back launch, and the end of attempts without progress,
    # which pages on-call once the job has resumed at least once and fails it plainly before.
    (S.RECOVERING, "relaunch-due"): S.RECOVERING,
    **{(state, "no-progress"): S.RESUME_FAILED for state in (S.PROVISIONING, S.RUNNING, S.INTERRUPTED, S.RECOVERING)},
    **{(state, "no-progress-first"): S.FAILED for state in (S.PROVISIONING, S.RUNNING, S.INTERRUPTED, S.RECOVERING)},
    # Stops that end: nothing to wait for without a live instance; a runner that cannot be asked, or does not
    # answer before the deadline, is terminated and the job keeps what was committed.
    **{(state, "stop-no-instance"): S.STOPPED for state in (S.PROVISIONING, S.RUNNING, S.INTERRUPTED, S.RECOVERING)},
    (S.STOPPING, "stop-timeout"): S.STOPPED,
    (S.STOPPING, "stop-failed"): S.STOPPED,
    # The runner's second hang in an attempt ends it (runner/hang_watch.py): relaunched elsewhere, as an attempt that
    # ended on its own (a hang can be the host's); a stop under way keeps what was committed.
    (S.RUNNING, "hung"): S.RECOVERING,
    (S.INTERRUPTED, "hung"): S.RECOVERING,
    (S.STOPPING, "hung"): S.STOPPED,
}


def next_state(state: S, trigger: Trigger) -> S | None:
    """The state ``trigger`` leads to from ``state``, or None when it is not allowed there."""
    return TRANSITIONS.get((state, trigger))
