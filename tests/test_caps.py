"""The caps (handlers/caps.py), without I/O: which caps are in force for a job, and what each refusal says."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bot.chat.catalog import say
from handlers.caps import Caps, caps_for, concurrency_full, concurrency_refusal, nodes_refusal, price_refusal
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN, TINY, Recipe

ML = {"members": ["slack:U0ALICE"], "channels": ["slack:C0AAA"]}


def test_with_nothing_configured_a_job_has_its_recipes_nodes_and_a_team_five_nodes_at_once() -> None:
    caps = caps_for(PolicyConfig(teams={"ml": ML}), TINY.max_nodes, "ml", "slack:U0ALICE")
    assert caps == Caps("team:ml", "ml", TINY.max_nodes, 5, None, None)
    assert Recipe(name="plain", description="d", model="m", command=["true"]).max_nodes == 1  # 1 unless it says more
    assert BUILT_IN["deepseek-7b"].max_nodes == 1 and TINY.max_nodes == 4  # tiny: the gang tests' small gangs
    refused = nodes_refusal(caps_for(PolicyConfig(), BUILT_IN["deepseek-7b"].max_nodes, None, "slack:U1"), "d", 64)
    assert refused is not None and refused.key == "cap.nodes-no-team"
    assert nodes_refusal(caps, "tiny", 4) is None
    assert concurrency_full(caps, group_active=4, total_active=4, nodes=1) is None  # the fifth node fits
    assert concurrency_full(caps, group_active=5, total_active=5, nodes=1) == "group"  # the sixth does not


def test_a_person_on_no_team_is_a_team_of_one_and_the_total_bounds_everyone() -> None:
    policy = PolicyConfig(max_total_nodes=8)
    alone = caps_for(policy, 1, None, "slack:U0MAL")
    assert alone.group == "user:slack:U0MAL" and alone.max_concurrent_nodes == 5
    assert concurrency_full(alone, group_active=0, total_active=7, nodes=2) == "total"
    assert concurrency_full(alone, group_active=0, total_active=6, nodes=2) is None
    words = concurrency_refusal(alone, "total", 7, 2)
    assert words.key == "cap.total-nodes" and "policy.max_total_nodes" in str(words)
    mine = concurrency_refusal(alone, "group", 5, 1)
    assert mine.key == "cap.own-nodes" and "policy.max_concurrent_nodes" in str(mine)


def test_an_admins_per_team_override_lifts_each_cap_for_that_team_alone() -> None:
    lifted = {**ML, "max_nodes": 64, "max_concurrent_nodes": 128, "max_hourly_price": 500.0}
    policy = PolicyConfig(teams={"ml": lifted, "ops": {"members": ["slack:U0BOB"]}}, max_hourly_price=2.0)
    ml = caps_for(policy, 1, "ml", "slack:U0ALICE")
    ops = caps_for(policy, 1, "ops", "slack:U0BOB")
    assert (ml.max_nodes, ml.max_concurrent_nodes, ml.max_hourly_price) == (64, 128, 500.0)
    assert (ops.max_nodes, ops.max_concurrent_nodes, ops.max_hourly_price) == (1, 5, 2.0)
    assert nodes_refusal(ml, "deepseek-7b", 64) is None and concurrency_full(ml, 64, 64, 64) is None
    assert price_refusal(ml, 400.0, 64) is None
    refused = nodes_refusal(ops, "deepseek-7b", 64)
    assert refused is not None and refused.key == "cap.nodes" and "policy.teams.ops.max_nodes" in str(refused)
    dear = price_refusal(ops, 2.5, 1)
    assert dear is not None and "policy.teams.ops.max_hourly_price" in str(dear) and "$2.50/h" in str(dear)
    assert price_refusal(ops, None, 1) is None  # a price the cloud cannot say is not refused for it
    assert price_refusal(caps_for(PolicyConfig(), 1, None, "u:x"), 1000.0, 1) is None  # no price cap configured


@pytest.mark.parametrize(
    "policy",
    [
        {"max_concurrent_nodes": 0},
        {"max_total_nodes": 0},
        {"max_hourly_price": 0},
        {"teams": {"ml": {**ML, "max_nodes": 65}}},  # past what any job may have
        {"teams": {"ml": {**ML, "max_concurrent_nodes": 0}}},
        {"teams": {"ml": {**ML, "max_hourly_price": -1}}},
        {"max_concurrent_jobs": 3},  # the old name is gone, not quietly ignored
    ],
)
def test_a_cap_out_of_range_or_misspelt_is_a_config_error(policy: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PolicyConfig.model_validate(policy)


def test_each_refusal_names_its_limit_and_who_changes_it_in_both_languages() -> None:
    ml = caps_for(PolicyConfig(teams={"ml": ML}, max_total_nodes=20, max_hourly_price=1.0), 1, "ml", "slack:U0ALICE")
    alone = caps_for(PolicyConfig(max_hourly_price=1.0), 1, None, "slack:U0MAL")
    reasons = [
        nodes_refusal(ml, "deepseek-7b", 64),
        nodes_refusal(alone, "deepseek-7b", 64),
        price_refusal(ml, 3.0, 2),
        price_refusal(alone, 3.0, 2),
        concurrency_refusal(ml, "group", 5, 1),
        concurrency_refusal(alone, "group", 5, 1),
        concurrency_refusal(ml, "total", 20, 1),
    ]
    for reason in reasons:
        assert reason is not None
        english, chinese = say("en", reason), say("zh-CN", reason)
        assert english == str(reason) and "admin" in english
        assert chinese != english and "管理员" in chinese
        setting = next(word for word in english.split() if word.startswith(("policy.", "max_")))
        assert setting.rstrip(",;") in chinese  # the setting to change, spelt as it is typed
