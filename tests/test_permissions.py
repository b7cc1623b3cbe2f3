"""The permission table (handlers/permissions.py), without I/O: who may do what to which job, from where."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from handlers.commands import USAGE, Action
from handlers.failures import Failure
from handlers.jobs import ChatRef, Job, JobState, Page
from handlers.oncall import OnCall
from handlers.permissions import channel_sees_costs, describe, home_team, job_refusal, narrowed, sees
from handlers.policy_config import PolicyConfig

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
A = ChatRef(platform="slack", channel="C0AAA")
B = ChatRef(platform="slack", channel="C0BBB")
POLICY = PolicyConfig(
    admins=["slack:U0ADMIN"],
    teams={
        "ml": {"members": ["slack:U0ALICE", "slack:U0TINA"], "channels": ["slack:C0AAA"]},
        "ops": {"members": ["slack:U0BOB"], "channels": []},
    },
)
ONCALL = OnCall(
    people={"olga": {"slack": "U0OLGA"}, "pete": {"slack": "U0PETE", "console": "pete"}},
    rota=[["olga"]],
    rota_starts=datetime(2026, 1, 5, 9, tzinfo=UTC),
)


def job(state: JobState = JobState.RUNNING, page: Page | None = None, chat: ChatRef = A) -> Job:
    team = home_team(POLICY, "slack:U0ALICE", chat)
    return Job(id="ft-ab12", recipe="tiny", requested_by="slack:U0ALICE", chat=chat, team=team, state=state, page=page)


def refusal(user: str, action: Action, subject: Job, where: ChatRef = A) -> str | None:
    reason = job_refusal(POLICY, ONCALL, user, where, action, subject, NOW)
    return None if reason is None else reason.key


# Who may do what to alice's job (home channel A, team ml), asking in channel A; None: allowed.
TABLE: list[tuple[str, Action, str | None]] = [
    *((user, "stop", None) for user in ("slack:U0ALICE", "slack:U0TINA", "slack:U0ADMIN")),
    *(
        (user, action, "refused.not-yours")
        for user in ("slack:U0BOB", "slack:U0MAL")
        for action in ("stop", "logs", "history")
    ),
    ("slack:U0BOB", "interrupt-test", "refused.not-yours"),
    ("slack:U0BOB", "resume", "refused.not-yours"),
    ("slack:U0BOB", "ack", "refused.not-yours"),
    ("slack:U0OLGA", "ack", "refused.not-yours"),  # on call, but the job has no page
    ("slack:U0TINA", "interrupt-test", None),
    ("slack:U0TINA", "logs", None),
    ("slack:U0TINA", "history", None),
    ("slack:U0MAL", "status", None),  # anyone in the job's channel sees its card
    ("slack:U0MAL", "chart", None),  # and its chart: who may see the one may see the other
]


@pytest.mark.parametrize(("user", "action", "expected"), TABLE)
def test_the_owner_the_team_and_the_admins_act_on_a_job_and_nobody_else(
    user: str, action: Action, expected: str | None
) -> None:
    assert refusal(user, action, job()) == expected


def test_another_channel_sees_neither_the_card_nor_the_log_except_for_admins() -> None:
    for action in ("status", "logs", "history", "chart"):
        assert refusal("slack:U0MAL", action, job(), where=B) == "refused.other-channel"
        assert refusal("slack:U0ALICE", action, job(), where=B) == "refused.other-channel"  # the owner asks at home
        assert refusal("slack:U0ADMIN", action, job(), where=B) is None
    assert refusal("slack:U0ALICE", "stop", job(), where=B) is None  # acting is the person's, wherever they are
    assert refusal("slack:U0MAL", "stop", job(), where=B) == "refused.not-yours"
    assert sees(POLICY, "slack:U0MAL", A, job()) and not sees(POLICY, "slack:U0MAL", B, job())
    assert not sees(POLICY, "slack:U0MAL", ChatRef(platform="dingtalk", channel="C0AAA"), job())
    assert sees(POLICY, "slack:U0ADMIN", ChatRef(platform="console", channel="x"), job())


def test_a_paged_job_may_be_acked_and_resumed_by_the_on_call_it_named_or_who_is_on_shift() -> None:
    late = Failure.of("start-timeout")
    page = Page(attempt=2, opened_at=NOW, reason=late, sent=2, named=["slack:U0PETE", "console:pete"])
    paged = job(JobState.RESUME_FAILED, page)
    for user in ("slack:U0PETE", "console:pete", "slack:U0OLGA"):  # named by a step; olga: on shift now
        assert refusal(user, "ack", paged) is None
        assert refusal(user, "resume", paged) is None
        assert refusal(user, "stop", paged) == "refused.not-yours"  # the page is theirs, the job is not
    assert refusal("slack:U0MAL", "ack", paged) == "refused.not-yours-paged"
    assert refusal("slack:U0MAL", "resume", paged) == "refused.not-yours-paged"
    assert refusal("slack:U0ALICE", "ack", paged) is None
    stopped = job(JobState.STOPPED)  # no page: resuming belongs to the owner, team and admins only
    assert refusal("slack:U0OLGA", "resume", stopped) == "refused.not-yours"


def test_a_jobs_team_is_its_channels_team_for_a_member_else_its_owners_only_team() -> None:
    assert home_team(POLICY, "slack:U0ALICE", A) == "ml"  # a member in ml's home: ml's job
    assert home_team(POLICY, "slack:U0ADMIN", A) == "ml"  # an admin there too
    assert home_team(POLICY, "slack:U0MAL", A) is None  # a stranger in ml's home: not billed to ml (on no team)
    assert home_team(POLICY, "slack:U0BOB", A) == "ops"  # bob in ml's home: billed to his own team, not to ml
    assert home_team(POLICY, "slack:U0BOB", B) == "ops"  # bob is on one team
    assert home_team(POLICY, "slack:U0MAL", B) is None
    two = PolicyConfig(teams={"x": {"members": ["slack:U1"]}, "y": {"members": ["slack:U1"]}})
    assert home_team(two, "slack:U1", B) is None  # on two teams: neither is guessed
    bobs = Job(id="ft-cd34", recipe="tiny", requested_by="slack:U0BOB", chat=B, team="ops")
    assert refusal("slack:U0ALICE", "stop", bobs, where=B) == "refused.not-yours"
    assert refusal("slack:U0BOB", "stop", bobs, where=B) is None
    old = Job(id="ft-ef56", recipe="tiny", requested_by="slack:U0ALICE", chat=A)  # stored before teams: no team
    assert refusal("slack:U0TINA", "stop", old) == "refused.not-yours"
    assert refusal("slack:U0ALICE", "stop", old) is None


def test_a_costs_chart_goes_to_a_channel_only_when_every_team_it_shows_calls_it_home() -> None:
    """Its words go to who asked; the chart is for the channel's people, who may not be allowed more."""
    assert channel_sees_costs(POLICY, A, ("ml",))
    assert not channel_sees_costs(POLICY, A, None)  # an admin's report of every team
    assert not channel_sees_costs(POLICY, A, ("ml", "ops"))  # a member of both, asking in ml's home
    assert not channel_sees_costs(POLICY, B, ("ml",))  # ml's costs, asked elsewhere
    assert not channel_sees_costs(POLICY, A, ("nope",)) and not channel_sees_costs(POLICY, A, ())


def test_allow_rules_narrow_an_action_for_everyone_and_leave_the_others_alone() -> None:
    policy = PolicyConfig(admins=["slack:U0ADMIN"], allow={"start": ["slack:*"], "stop": ["slack:U0ALICE"]})
    assert narrowed(policy, "slack:U0ANY", "start") is None
    assert narrowed(policy, "dingtalk:x", "start") is not None
    assert narrowed(policy, "slack:U0ADMIN", "stop") is not None  # a rule narrows admins too
    assert narrowed(policy, "slack:U0ALICE", "stop") is None
    assert narrowed(policy, "slack:U0ANY", "ack") is None  # no rule names ack: not narrowed
    assert narrowed(PolicyConfig(), "slack:U0ANY", "stop") is None
    assert all(narrowed(PolicyConfig(allow={"help": ["*"]}), "x:y", verb) is None for verb in USAGE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"admins": ["U0ADMIN"]}, "is not platform:id"),
        ({"teams": {"ml": {"members": ["alice"]}}}, "is not platform:id"),
        ({"teams": {"ml": {"channels": ["C0AAA"]}}}, "is not platform:id"),
        ({"teams": {"a": {"channels": ["slack:C1"]}, "b": {"channels": ["slack:C1"]}}}, "home of two teams"),
        ({"allow": {"deploy": ["*"]}}, "allow names deploy"),
        ({"allow": {"stop": ["alice"]}}, "is not platform:id, platform:\\* or \\*"),
        ({"rate": {"commands_per_minute": 0}}, "greater than or equal to 1"),
        ({"retention_days": 0}, "greater than 0"),
    ],
)
def test_a_policy_that_cannot_mean_what_it_says_is_refused(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig.model_validate(config)


def test_the_model_in_force_is_said_in_one_line() -> None:
    line = describe(POLICY)
    assert "\n" not in line and "admins: 1" in line and "ml (2 members)" in line
    assert "30 commands and 5 starts a minute" in line and "kept 30 days" in line
    assert "admins: none" in describe(PolicyConfig())
    assert "caps: 5 nodes at once a team, no total, no price cap, no team overrides" in describe(PolicyConfig())
    lifted = PolicyConfig(teams={"ml": {"max_nodes": 8}}, max_total_nodes=20, max_hourly_price=40)
    assert "caps: 5 nodes at once a team, 20 nodes in all, $40/h a job, overridden for ml" in describe(lifted)
