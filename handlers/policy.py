"""Who may do what, and the guards that keep a team's spend bounded: decisions, made without I/O.

Users are ``platform:id`` strings (``slack:U024BE7LH``, ``dingtalk:manager4220``, ``console:alice``). A rule
lists users, or ``platform:*`` for everyone on a platform, or ``*``. With no rules configured, everyone may
use every command (the bot says so once at start). Reading (status, list, logs, help) is always allowed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from handlers.commands import Action
from handlers.lifecycle import Lifecycle
from handlers.reasons import Reason, Wording
from handlers.spot.policies import POLICIES
from handlers.spot.rules import DEFAULT_POLICY

GUARDED_ACTIONS: tuple[Action, ...] = ("start", "stop", "interrupt-test", "ack", "resume")
READ_ACTIONS = frozenset({"status", "list", "logs", "help"})

WORDING = Wording(
    {
        "refused.not-allowed": "you are not allowed to {action} jobs; ask an admin to add {user} to the {action} rule",
        "guard.concurrency": "{active} jobs are already running (the limit is {limit}); stop one first",
        "guard.price": "${price:.2f}/h is above the configured cap of ${cap:.2f}/h",
    }
)


class SpotSettings(BaseModel):
    """The ``policy.spot`` section: which spot policy steers jobs started with a deadline or budget (all jobs,
    when it is not the default), and how often it is asked again while such a job is active. A job it does not
    steer runs ``spot-first`` (:mod:`handlers.spot.policies`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = DEFAULT_POLICY
    tick_seconds: float = Field(default=300.0, ge=1, le=86_400)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown spot policy {value!r}; one of {', '.join(sorted(POLICIES))}")
        return value


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    allow: dict[str, list[str]] | None = None
    max_concurrent_jobs: int | None = Field(default=None, ge=1)
    max_hourly_price: float | None = Field(default=None, gt=0)
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)  # bounded relaunches, the stop deadline
    spot: SpotSettings = Field(default_factory=SpotSettings)  # the spot policy (handlers/spot/)

    @property
    def open(self) -> bool:
        """True when no permission rules are configured (everyone may do everything)."""
        return self.allow is None


def may(policy: Policy, user: str, action: Action) -> bool:
    if action in READ_ACTIONS or policy.allow is None:
        return True
    platform = user.split(":", 1)[0]
    allowed = policy.allow.get(action, [])
    return "*" in allowed or user in allowed or f"{platform}:*" in allowed


def refusal(policy: Policy, user: str, action: Action) -> Reason | None:
    """Why ``user`` may not do ``action``, or None when they may."""
    if may(policy, user, action):
        return None
    return WORDING("refused.not-allowed", action=action, user=user)


def guard_start(policy: Policy, active_jobs: int, hourly_price: float | None) -> Reason | None:
    """Why a new job may not start now (concurrency or price cap), or None."""
    if policy.max_concurrent_jobs is not None and active_jobs >= policy.max_concurrent_jobs:
        return WORDING("guard.concurrency", active=active_jobs, limit=policy.max_concurrent_jobs)
    if policy.max_hourly_price is not None and hourly_price is not None and hourly_price > policy.max_hourly_price:
        return WORDING("guard.price", price=hourly_price, cap=policy.max_hourly_price)
    return None
