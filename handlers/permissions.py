"""Who may do what to which job: the permission table, as pure functions of the policy, the person and the job.

The model (docs/permissions.md):

- anyone may ``start`` (within the caps and the rate) and read ``help``;
- ``status``, ``list``, ``logs``, ``history`` and ``chart`` show only the jobs of the channel asked in; admins see
  every channel's;
- ``stop``, ``interrupt-test``, ``resume``, ``logs`` and ``history`` of a job belong to its owner (who started it),
  the members of its team and the admins; ``ack`` and ``resume`` of a job with an open page also to the on-call the
  page named (or who is on shift now);
- ``costs`` shows a team's spend to its members, every team's (and the jobs of no team) to the admins;
- ``policy.allow`` rules narrow who may use an action at all (an action no rule names is not narrowed).

Each refusal is one sentence (a :class:`~handlers.reasons.Reason`, put in the channel's language by the bot).
A user is ``platform:id``; a channel ``platform:channel``, as in the config.
"""

from __future__ import annotations

from datetime import datetime

from handlers.commands import Action
from handlers.jobs import ChatRef, Job
from handlers.oncall import OnCall, on_call_now
from handlers.policy_config import PolicyConfig
from handlers.reasons import Reason, Wording

# The owner's, the team's (and the admins').
JOB_ACTIONS: frozenset[Action] = frozenset({"stop", "interrupt-test", "resume", "logs", "history", "ack"})
PAGE_ACTIONS: frozenset[Action] = frozenset({"ack", "resume"})  # also the paged on-call's
# Only in the job's channel (admins: anywhere). A chart shows what the status shows: whoever may see one sees both.
CHANNEL_BOUND: frozenset[Action] = frozenset({"status", "logs", "history", "chart"})

WORDING = Wording(
    {
        "refused.not-allowed": "you are not allowed to {action} jobs; ask an admin to add {user} to the {action} rule",
        "refused.not-yours": "{job} is not yours to {action}: only its owner, its team and the admins may",
        "refused.not-yours-paged": (
            "{job} is not yours to {action}: only its owner, its team, the admins and the on-call it paged may"
        ),
        "refused.other-channel": "{job} is not a job of this channel; ask in the channel it was started in",
        "refused.no-such-team": "there is no team {team}",
        "refused.costs-not-member": "the costs of {team} are shown to its members and the admins only",
        "refused.costs-no-team": "costs are shown to a team's members and the admins; you are on no team",
    }
)


def channel_id(chat: ChatRef) -> str:
    """A channel as the config names it: ``slack:C0123ABCD``."""
    return f"{chat.platform}:{chat.channel}"


def is_admin(policy: PolicyConfig, user: str) -> bool:
    return user in policy.admins


def team_of_channel(policy: PolicyConfig, chat: ChatRef | None) -> str | None:
    """The team whose home ``chat`` is, if any."""
    if chat is None:
        return None
    channel = channel_id(chat)
    return next((name for name, team in sorted(policy.teams.items()) if channel in team.channels), None)


def home_team(policy: PolicyConfig, user: str, chat: ChatRef | None) -> str | None:
    """The team a job ``user`` starts in ``chat`` is billed to and counted against: the channel's team when they
    are one of its members (or an admin), else their own team when they are on exactly one, else none (a team of
    one under the default caps, :mod:`handlers.caps`). A stranger's start in a team's channel is not billed to the
    team: it would spend the team's money and take its room under the caps. It is not refused either: the start
    goes on, billed and counted where its starter belongs."""
    team = team_of_channel(policy, chat)
    if team is not None and (user in policy.teams[team].members or is_admin(policy, user)):
        return team
    mine = teams_of(policy, user)
    return mine[0] if len(mine) == 1 else None


def narrowed(policy: PolicyConfig, user: str, action: Action) -> Reason | None:
    """Why an ``allow`` rule keeps ``user`` from ``action`` altogether, or None."""
    if policy.allow is None or action not in policy.allow:
        return None
    platform = user.split(":", 1)[0]
    allowed = policy.allow[action]
    if "*" in allowed or user in allowed or f"{platform}:*" in allowed:
        return None
    return WORDING("refused.not-allowed", action=action, user=user)


def sees(policy: PolicyConfig, user: str, chat: ChatRef, job: Job) -> bool:
    """Whether ``job`` is shown to ``user`` asking in ``chat``: a job of that channel, or to an admin any job."""
    if is_admin(policy, user):
        return True
    return job.chat is not None and (job.chat.platform, job.chat.channel) == (chat.platform, chat.channel)


def acts_for(policy: PolicyConfig, user: str, job: Job) -> bool:
    """Whether ``user`` acts for ``job``: its owner, a member of its team, or an admin."""
    if user == job.requested_by or is_admin(policy, user):
        return True
    team = policy.teams.get(job.team) if job.team is not None else None
    return team is not None and user in team.members


def paged(oncall: OnCall, user: str, job: Job, now: datetime) -> bool:
    """Whether ``user`` is the on-call of the job's open page: named by one of its steps, or on shift now."""
    if job.page is None:
        return False
    return user in job.page.named or user in on_call_now(oncall, now)


def job_refusal(
    policy: PolicyConfig, oncall: OnCall, user: str, chat: ChatRef, action: Action, job: Job, now: datetime
) -> Reason | None:
    """Why ``user`` in ``chat`` may not ``action`` ``job``, or None when they may (``allow`` rules aside:
    :func:`narrowed`)."""
    if action in CHANNEL_BOUND and not sees(policy, user, chat, job):
        return WORDING("refused.other-channel", job=job.id)
    if action not in JOB_ACTIONS or acts_for(policy, user, job):
        return None
    if action in PAGE_ACTIONS and paged(oncall, user, job, now):
        return None
    key = "refused.not-yours-paged" if action in PAGE_ACTIONS and job.page is not None else "refused.not-yours"
    return WORDING(key, job=job.id, action=action)


def describe(policy: PolicyConfig) -> str:
    """The model in force, for the log at start (one line)."""
    teams = ", ".join(f"{name} ({len(team.members)} members)" for name, team in sorted(policy.teams.items()))
    narrowing = ", ".join(sorted(policy.allow)) if policy.allow else "none"
    return (
        "permissions: a job's owner, team and admins act on it; channels see their own jobs; "
        f"admins: {len(policy.admins) or 'none'}; teams: {teams or 'none'}; allow rules narrow: {narrowing}; "
        f"rate per user: {policy.rate.commands_per_minute} commands and {policy.rate.starts_per_minute} starts "
        f"a minute; caps: {caps_in_force(policy)}; ended jobs kept {policy.retention_days:g} days"
    )


def caps_in_force(policy: PolicyConfig) -> str:
    """The caps in force, in a few words (the log at start): each team's nodes, all teams', the price, overrides."""
    total = f"{policy.max_total_nodes} nodes in all" if policy.max_total_nodes is not None else "no total"
    price = f"${policy.max_hourly_price:g}/h a job" if policy.max_hourly_price is not None else "no price cap"
    lifted = sorted(
        name
        for name, team in policy.teams.items()
        if (team.max_nodes, team.max_concurrent_nodes, team.max_hourly_price) != (None, None, None)
    )
    overrides = f"overridden for {', '.join(lifted)}" if lifted else "no team overrides"
    return f"{policy.max_concurrent_nodes} nodes at once a team, {total}, {price}, {overrides}"


def teams_of(policy: PolicyConfig, user: str) -> tuple[str, ...]:
    """The teams ``user`` is a member of, by name."""
    return tuple(name for name, team in sorted(policy.teams.items()) if user in team.members)


def cost_refusal(policy: PolicyConfig, user: str, team: str | None) -> Reason | None:
    """Why ``user`` may not see the costs of ``team`` (of their own teams when None), or None when they may."""
    if team is not None and team not in policy.teams:
        return WORDING("refused.no-such-team", team=team)
    if is_admin(policy, user):
        return None
    if team is not None:
        return None if team in teams_of(policy, user) else WORDING("refused.costs-not-member", team=team)
    return None if teams_of(policy, user) else WORDING("refused.costs-no-team")


def cost_teams(policy: PolicyConfig, user: str, team: str | None) -> tuple[str, ...] | None:
    """The teams whose costs ``user`` asked for and may see (call :func:`cost_refusal` first): the one named, else
    an admin's every job (None), a member's their own teams."""
    if team is not None:
        return (team,)
    return None if is_admin(policy, user) else teams_of(policy, user)


def channel_sees_costs(policy: PolicyConfig, chat: ChatRef, teams: tuple[str, ...] | None) -> bool:
    """Whether the costs of ``teams`` may be shown to everyone in ``chat`` (the report's chart is posted there, while
    its words go to who asked only): when each team calls that channel home. A report of every team (None), or of
    a team whose home is elsewhere, stays with who asked: the channel's other people may not be allowed to see it."""
    channel = channel_id(chat)
    return bool(teams) and all(team in policy.teams and channel in policy.teams[team].channels for team in teams or ())
