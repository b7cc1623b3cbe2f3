"""The job: what the bot knows about one fine-tune, across all of its attempts.

A job is one record (JSON in the store) changed only through :class:`handlers.change.Change` values produced by the pure
decision code in ``handlers``; the store applies a change atomically together with its history entry, its
dedup key and its outbox (the follow-up effects and timers, each put on its executor's queue in the same
transaction).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from handlers.clock import utcnow
from handlers.failures import Failure
from handlers.ids import JOB_ID_PATTERN, new_key_salt


class JobState(StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    INTERRUPTED = "INTERRUPTED"
    RECOVERING = "RECOVERING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RESUME_FAILED = "RESUME_FAILED"


TERMINAL_STATES = frozenset({JobState.STOPPED, JobState.SUCCEEDED, JobState.FAILED})
# States in which the job holds (or is acquiring) capacity: they count against the concurrency guard.
ACTIVE_STATES = frozenset(
    {
        JobState.PENDING,
        JobState.PROVISIONING,
        JobState.RUNNING,
        JobState.INTERRUPTED,
        JobState.RECOVERING,
        JobState.STOPPING,
    }
)

Market = Literal["spot", "on-demand"]


class ChatRef(BaseModel):
    """Where the job talks: the platform, the channel, and the job card's message once posted."""

    model_config = ConfigDict(frozen=True)
    platform: str
    channel: str
    card_id: str | None = None


class Attempt(BaseModel):
    """One launch of the job on one instance."""

    model_config = ConfigDict(frozen=True)
    number: int = Field(ge=1)
    # Drawn when the attempt is planned and kept with it: its report key is derived from it (handlers/report_keys.py),
    # so the key of attempt N of this job is no other record's attempt N's.
    key_salt: str = Field(default_factory=new_key_salt, pattern=r"^[0-9a-f]{32}$")
    market: Market = "spot"
    instance_id: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    price_per_hour: float | None = None
    on_demand_price_per_hour: float | None = None
    # Checkpoint bytes across regions (handlers/egress.py): what it pays per GB moved (its zone's region is not the
    # bucket's: the cloud's inter-region price; else 0), and the bytes its runner restored and committed.
    egress_price_per_gb: float = Field(default=0.0, ge=0.0)
    moved_bytes: int = Field(default=0, ge=0)
    launched_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    resumed_from_step: int | None = None
    # The job's best step when this attempt was planned: it made progress if the job got past it (lifecycle.py).
    from_step: int | None = None
    # At its interruption: the step its trainer had reached, and the steps lost past the committed checkpoint (the
    # job's total counts them then; a commit that lands later, or the next attempt's restore, corrects it).
    reached_step: int | None = None
    lost_steps: int | None = None
    steps_unknown: bool = False  # its runner could not see the trainer's step (no progress file): lost unknown
    # The runner's restore (its Started report) and the first step's report: the restart overhead (restart_overhead.py).
    restore_seconds: float | None = None
    first_step_at: datetime | None = None
    # The provider's figure of its launch, request to host booted (the local cloud's profile; None: not given), and
    # how many nodes were launched with it in one go (a whole gang's: its size; a replacement: 1).
    launch_seconds: float | None = None
    launched_with: int = 1
    # The cloud's spot notice, from its notice to the reclaim (AWS 120 s, Alibaba 5 min, the local cloud its grace):
    # the window a notice-driven commit has (handlers/notice_budget.py). None: the launch did not say.
    notice_seconds: float | None = None
    # A gang node (handlers/gang.py): its rank in the world its runner is in now, and that world's generation (None:
    # a single-node job). ``started_generation``: the newest generation it reported ``started`` in;
    # ``next_rank``: its rank in the job's next generation, until its regroup is written.
    node_rank: int | None = None
    generation: int | None = None
    started_generation: int | None = None
    next_rank: int | None = None
    standby_step: int | None = None  # a gang survivor stands by with this checkpoint (until its regroup)
    private_ip: str | None = None  # where the other nodes reach it (the launch's word)
    # Launched ahead of a switch of market (the job's ``standby``): when it was told to go, the previous attempt's
    # checkpoint being in. Such an attempt measures no restart overhead (restart_overhead.py): its boot overlapped
    # training.
    handed_over_at: datetime | None = None


class CheckpointRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    step: int
    uri: str
    at: datetime = Field(default_factory=utcnow)


class Page(BaseModel):
    """The on-call page of a failed resume: opened with the failure, closed by a retry or a stop.

    ``sent`` counts the escalation steps already sent (see :mod:`handlers.oncall`); a step is sent only when it
    is the next one and nobody has acknowledged.
    """

    model_config = ConfigDict(frozen=True)
    attempt: int
    opened_at: datetime
    reason: Failure
    detail: dict[str, Any] = Field(default_factory=dict)
    sent: int = 0
    acked_by: str | None = None
    acked_at: datetime | None = None
    named: list[str] = Field(default_factory=list)  # the platform ids its steps called: they may ack and resume
    tools: list[str] = Field(default_factory=list)  # the paging tools its steps opened it in (handlers/pagers.py)
    acked_via: str | None = None  # the paging tool it was acknowledged in (None: in chat)


class PlanChoice(BaseModel):
    """The spot policy's latest choice for the job, as data for the card: what, where, why (a catalogue key and
    its values: the channel's language words it), and what it projects (finish, total cost) if it holds."""

    model_config = ConfigDict(frozen=True)
    action: Literal["spot", "on-demand", "wait", "stop"]
    zone: str | None = None
    reason: str
    values: dict[str, Any] = Field(default_factory=dict)
    event: str = "launch"
    at: datetime
    finish: datetime | None = None
    cost: float | None = None


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(pattern=JOB_ID_PATTERN)
    recipe: str
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)
    requested_by: str  # the owner: ``platform:id`` of who started it
    chat: ChatRef | None = None  # its home channel (where it was started)
    team: str | None = None  # its team (policy.teams), when one was configured for it at start
    state: JobState = JobState.PENDING
    attempts: list[Attempt] = Field(default_factory=list)
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_bytes: int | None = None  # the size of its newest committed checkpoint (what a cross-region move moves)
    # The notice budget (handlers/notice_budget.py): the runner's measured save and upload rate, the steps between
    # its periodic saves, and whether the thread was warned that a notice-driven commit would not fit.
    checkpoint_save_seconds: float | None = None
    upload_bytes_per_second: float | None = None
    checkpoint_interval_steps: int | None = None
    notice_budget_warned: bool = False
    interruptions: int = 0
    attempts_without_progress: int = 0  # ended in a row without getting further (bounded relaunches)
    steps_lost: int = 0
    steps_lost_unknown: bool = False  # an interruption lost an unknown number of steps besides ``steps_lost``
    downtime_seconds: float = 0.0
    output_uri: str | None = None
    failure: Failure | None = None  # why it ended
    page: Page | None = None
    # The spot policy (handlers/spot/): what the job was started with, and what the policy chose last.
    deadline: datetime | None = None
    budget: float | None = None
    spot_policy: str | None = None  # the configured policy's name at start; None: spot-first
    plan: PlanChoice | None = None
    refused_zones: dict[str, datetime] = Field(default_factory=dict)  # a spot launch refused for capacity, when
    switch_to: Market | None = None  # STOPPING to move to this market (a relaunch follows the checkpoint)
    switch_zone: str | None = None
    # The next attempt, launched ahead of a switch of market while the current one trains on (make-before-break):
    # the current one stops when this one stands by, and this one becomes current once that checkpoint is in.
    standby: Attempt | None = None
    # The highest number a launch ahead took: one given up (refused, never stood by) is never launched again, so
    # the cloud's one-instance-per-(job, attempt) and the attempt's report key stay one attempt's.
    ahead_number: int = 0
    tick: int = 0  # the number of the job's live policy-tick chain (a tick of another number is stale)
    # Launch-to-first-step overhead: the median of the job's attempts; until one is measured, its recipe's.
    restart_seconds: float | None = None
    # A gang (multi-node job, handlers/gang.py): how many nodes train as one world, its current generation (the
    # world changes when a node is replaced), and whether its nodes ask for EFA interfaces.
    nodes: int = 1
    generation: int = 1
    efa: bool = False
    held_since: datetime | None = None  # a gang's survivors wait for a replacement the cloud refused, since then
    # A gang that lost a node restarts whole (handlers/decide/gang_recovery.py) once its survivors stand by.
    restart_whole: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    version: int = 0

    @property
    def attempt(self) -> int:
        """The current attempt number (0 before the first launch)."""
        return self.attempts[-1].number if self.attempts else 0

    @property
    def acked_by(self) -> str | None:
        """Who acknowledged the open page, if anyone."""
        return self.page.acked_by if self.page else None

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def gang_attempts(self) -> dict[int, Attempt]:
        """A gang's live attempt per node rank (the rank in the job's current generation), empty for one node."""
        if self.nodes <= 1:
            return {}
        live: dict[int, Attempt] = {}
        for attempt in self.attempts:
            rank = attempt.next_rank if attempt.next_rank is not None else attempt.node_rank
            if attempt.ended_at is None and rank is not None:
                live[rank] = attempt
        return dict(sorted(live.items()))

    @property
    def next_number(self) -> int:
        """The number the job's next attempt takes (after any launched ahead, kept or given up)."""
        return max(self.attempt, self.ahead_number) + 1

    def attempt_numbered(self, number: int) -> Attempt | None:
        """The attempt of that number, if the job has one."""
        return next((attempt for attempt in self.attempts if attempt.number == number), None)

    @property
    def instance_ids(self) -> list[str]:
        return [attempt.instance_id for attempt in self.attempts if attempt.instance_id]
