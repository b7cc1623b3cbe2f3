"""The ``policy`` section: who is an admin, which teams there are, the ``allow`` rules, the caps and bounds.

Users are ``platform:id`` strings (``slack:U024BE7LH``, ``dingtalk:manager4220``, ``console:alice``); a channel
is named the same way (``slack:C0123ABCD``, ``dingtalk:cidXXXX==``). What these settings permit is decided in
:mod:`handlers.permissions`; this module holds the settings and the guards that keep a team's spend bounded.
An ``allow`` rule lists users, or ``platform:*`` for everyone on a platform, or ``*``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from handlers.commands import USAGE
from handlers.job_options import MAX_NODES
from handlers.lifecycle import Lifecycle
from handlers.spot.policies import POLICIES
from handlers.spot.rules import DEFAULT_POLICY

# A user or channel as the config names it: the platform, a colon, the platform's own id.
PLATFORM_ID = r"^[a-z]{2,16}:[^\s:][^\s]{0,127}$"
RULE_ENTRY = r"^(\*|[a-z]{2,16}:\*|[a-z]{2,16}:[^\s:][^\s]{0,127})$"

# Each team's concurrent nodes when the config says nothing (handlers/caps.py); a person on no team is a team of one.
DEFAULT_TEAM_NODES = 5


class SpotSettings(BaseModel):
    """The ``policy.spot`` section: which spot policy steers jobs started with a deadline or budget (all jobs,
    when it is not the default), and how often it is asked again while such a job is active. A job it does not
    steer runs ``spot-first`` (:mod:`handlers.spot.policies`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = DEFAULT_POLICY
    tick_seconds: float = Field(default=300.0, ge=1, le=86_400)
    # A checkpoint's restore from the home region's bucket in another region, GB/s, until a job measures its own:
    # AWS caps an instance's flows to another region at 5 Gb/s.
    cross_region_gb_per_s: float = Field(default=0.625, gt=0, le=1000)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown spot policy {value!r}; one of {', '.join(sorted(POLICIES))}")
        return value


class Team(BaseModel):
    """A team: its ``members`` may act on its jobs; a job a member starts in one of its ``channels`` is the team's.
    The caps, when set, lift (or lower) the policy's for this team alone (:mod:`handlers.caps`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    members: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list)
    max_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)  # a job's nodes, instead of its recipe's
    max_concurrent_nodes: int | None = Field(default=None, ge=1)  # instead of policy.max_concurrent_nodes
    max_hourly_price: float | None = Field(default=None, gt=0)  # instead of policy.max_hourly_price

    @field_validator("members", "channels")
    @classmethod
    def _platform_ids(cls, values: list[str]) -> list[str]:
        return [_platform_id(value) for value in values]


class RateLimits(BaseModel):
    """Per user, shared by every replica (a token bucket in Redis): commands of any kind, and starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    commands_per_minute: int = Field(default=30, ge=1, le=10_000)
    starts_per_minute: int = Field(default=5, ge=1, le=10_000)


class PolicyConfig(BaseModel):
    """The config file's ``policy`` section (not a spot policy: those are :data:`handlers.spot.rules.SpotPolicy`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    admins: list[str] = Field(default_factory=list)  # may do anything to any job, and see every channel's jobs
    teams: dict[str, Team] = Field(default_factory=dict)
    allow: dict[str, list[str]] | None = None  # narrows who may use an action at all (an action not named: anyone)
    rate: RateLimits = Field(default_factory=RateLimits)
    max_concurrent_nodes: int = Field(default=DEFAULT_TEAM_NODES, ge=1)  # each team's nodes at once
    max_total_nodes: int | None = Field(default=None, ge=1)  # all teams' (and teamless people's) nodes at once
    max_hourly_price: float | None = Field(default=None, gt=0)  # a job's, all its nodes together
    retention_days: float = Field(default=30, gt=0, le=3650)  # an ended job is deleted this long after it ended
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)  # bounded relaunches, the stop deadline
    spot: SpotSettings = Field(default_factory=SpotSettings)  # the spot policy (handlers/spot/)

    @field_validator("admins")
    @classmethod
    def _admin_ids(cls, values: list[str]) -> list[str]:
        return [_platform_id(value) for value in values]

    @field_validator("allow")
    @classmethod
    def _rules(cls, rules: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        if rules is None:
            return None
        unknown = sorted(set(rules) - set(USAGE))
        if unknown:
            raise ValueError(f"allow names {', '.join(unknown)}: not commands (one of {', '.join(USAGE)})")
        for action, entries in rules.items():
            bad = [entry for entry in entries if not _matches(RULE_ENTRY, entry)]
            if bad:
                raise ValueError(f"allow.{action}: {bad[0]!r} is not platform:id, platform:* or *")
        return rules

    @model_validator(mode="after")
    def _one_home_per_channel(self) -> PolicyConfig:
        homes: dict[str, str] = {}
        for name, team in self.teams.items():
            for channel in team.channels:
                if channel in homes:
                    raise ValueError(f"channel {channel} is the home of two teams ({homes[channel]} and {name})")
                homes[channel] = name
        return self


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _platform_id(value: str) -> str:
    if not _matches(PLATFORM_ID, value):
        raise ValueError(f"{value!r} is not platform:id (slack:U0123ABCD, dingtalk:manager4220, console:alice)")
    return value
