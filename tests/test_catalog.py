"""The message catalogue: every topic in both languages, the languages in step, English as it always was."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.chat.catalog import LANGUAGES, en, messages, say, text
from bot.chat.render import card, card_text, message_text, recipes_text
from handlers import commands, decide, job_options, recipes, spot_decide, spot_policy
from handlers import policy as policy_module
from handlers import reconcile as reconcile_module
from handlers.commands import HELP, HELP_REASON, USAGE, UsageError, parse
from handlers.decide import ack_command, drill_command, retry_command, stop_command
from handlers.jobs import Attempt, CheckpointRef, Job, JobState, Page
from handlers.messages import Notify
from handlers.policy import Policy, guard_start, refusal
from handlers.reasons import Reason
from handlers.recipes import BUILT_IN, TINY, Parameter, Recipe, RecipeError, find_recipe
from handlers.reconcile import CloudInstance, reconcile
from tests.spot_cases import policy_reasons

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
CJK = re.compile(r"[\u4e00-\u9fff]")
PAGE_PEOPLE = [{"name": "ana", "slack": None, "dingtalk": "manager4220", "mobile": None}]

# Every topic the renderer knows, with the fields the handlers send (some in more than one shape).
TOPICS: list[tuple[str, dict[str, Any]]] = [
    ("interruption-warning", {"instance": "i-1", "source": "aws-imds", "deadline": NOW.isoformat()}),
    ("interruption-warning", {"instance": "i-1", "source": "aliyun-metadata", "deadline": None}),
    ("interrupted", {"step": 15, "seconds": {"save": 0.2, "upload": 0.1, "total": 0.3}, "saved_in_time": True}),
    ("interrupted", {"step": 10, "seconds": {"save": 9.0}, "saved_in_time": False, "note": "trainer too slow"}),
    ("resumed", {"attempt": 2, "zone": "cn-hangzhou-h", "resumed_from_step": 15, "lost": 0, "downtime": 41.5}),
    ("resumed", {"attempt": 3, "zone": None, "resumed_from_step": 5, "lost": 2, "downtime": 9, "skipped": [{}]}),
    ("completed", {"output_uri": "oss://bucket/jobs/ft-ab12/output/"}),
    ("failed", {"reason": "exit code 3", "log_tail": ["Traceback", "CUDA error"]}),
    ("resume-failed", {"reason": "no capacity", "step": 0, "steps": 3, "mention": PAGE_PEOPLE, "everyone": None}),
    ("resume-failed", {"reason": "no capacity", "step": 2, "steps": 3, "mention": [], "everyone": "channel"}),
    ("drill-started", {"instance": "i-1", "by": "dingtalk:manager4220"}),
    ("stop-requested", {"by": "dingtalk:manager4220"}),
    ("stopped", {"step": 12}),
    ("stopped", {}),
    ("acked", {"by": "dingtalk:manager4220", "at": NOW.isoformat()}),
    ("resume-requested", {"by": "slack:U1", "market": "on-demand"}),
    ("rebalance", {}),
    ("rebalance-checkpoint", {"step": 20, "seconds": 1.25}),
    ("instance-gone", {"instance": "i-1"}),
    ("spot-policy", {"reason": "spot-policy.stop.budget", "values": {"need": 9.5, "budget": 8.0, "spent": 4.0}}),
    ("relaunch-paused", {"attempt": 2, "count": 2, "limit": 3, "seconds": 60.0}),
    ("stop-failed", {"reason": "no such instance"}),
    ("drill-failed", {"reason": "FIS refused"}),
    # Reconciliation (handlers/reconcile.py): a code and its values, each code in the catalogue.
    ("instance-released", {"instance": "i-9", "why": "job-over", "values": {"job": "ft-ab12", "state": "SUCCEEDED"}}),
    ("instance-released", {"instance": "i-9", "why": "job-unknown", "values": {"job": "ft-zz99"}}),
    (
        "instance-released",
        {"instance": "i-1", "why": "moved-on", "values": {"job": "ft-ab12", "attempt": 1, "current": 2}},
    ),
    ("instance-released", {"instance": "i-1", "why": "moved-on-untagged", "values": {"job": "ft-ab12", "current": 2}}),
    ("no-reports", {"instance": "i-2", "minutes": 31}),
    (
        "group-released",
        {"group": "finetune-ft-ab12", "why": "job-over", "values": {"job": "ft-ab12", "state": "STOPPED"}},
    ),
]


def job() -> Job:
    first = Attempt(
        number=1,
        instance_id="i-1",
        instance_type="ecs.gn7i-c8g1.2xlarge",
        zone="cn-hangzhou-h",
        price_per_hour=0.42,
        on_demand_price_per_hour=1.68,
        launched_at=NOW - timedelta(hours=1),
        started_at=NOW - timedelta(minutes=58),
        ended_at=NOW - timedelta(minutes=20),
    )
    second = Attempt(
        number=2,
        instance_id="i-2",
        zone="cn-hangzhou-i",
        price_per_hour=0.40,
        on_demand_price_per_hour=1.68,
        launched_at=NOW - timedelta(minutes=19),
        started_at=NOW - timedelta(minutes=18),
        resumed_from_step=15,
    )
    return Job(
        id="ft-ab12",
        recipe="deepseek-7b",
        requested_by="dingtalk:manager4220",
        state=JobState.RUNNING,
        attempts=[first, second],
        step=40,
        total_steps=100,
        loss=0.8123,
        checkpoint=CheckpointRef(step=35, uri="oss://bucket/jobs/ft-ab12/checkpoints/checkpoint-35"),
        interruptions=1,
        downtime_seconds=41.5,
        failure="the runner crashed",
        page=Page(attempt=2, opened_at=NOW, reason="x", sent=1, acked_by="dingtalk:manager4220", acked_at=NOW),
    )


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_both_languages_have_the_same_entries_and_placeholders() -> None:
    en, zh = messages("en"), messages("zh-CN")
    assert en.keys() == zh.keys()
    for key in en:
        assert placeholders(en[key]) == placeholders(zh[key]), key


@pytest.mark.parametrize(("topic", "fields"), TOPICS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(TOPICS)])
def test_every_topic_renders_in_both_languages(topic: str, fields: dict[str, Any]) -> None:
    note = Notify(job_id="ft-ab12", channel="thread", topic=topic, fields=fields)
    english, chinese = (message_text(job(), note, NOW, lang) for lang in LANGUAGES)
    assert english != chinese
    assert CJK.search(chinese) and not CJK.search(english)


def test_the_card_has_no_english_label_or_state_in_chinese() -> None:
    for state in JobState:
        shown = card(job().model_copy(update={"state": state}), NOW, "zh-CN")
        labels = [label for label, _ in shown.fields]
        assert len(labels) >= 8 and all(CJK.search(label) and not re.search("[A-Za-z]", label) for label in labels)
        state_value = shown.fields[0][1]
        assert CJK.search(state_value) and not re.search("[A-Za-z]", state_value), state_value
    words = {key: value for key, value in messages("zh-CN").items() if key.startswith(("button.", "market."))}
    assert all(not re.search("[A-Za-z]", value) for value in words.values()), words


def test_english_stays_the_default_and_word_for_word() -> None:
    shown = card_text(job(), NOW)
    assert shown == card_text(job(), NOW, "en")
    assert shown.splitlines() == [
        "ft-ab12 · deepseek-7b",
        "  State: 🟢 RUNNING",
        "  Instance: i-2 · cn-hangzhou-i (spot, attempt 2)",
        "  Price: $0.40/h",
        "  Step: 40/100 · loss 0.8123",
        "  ETA: 43 min",
        "  Cost: $0.4067 · saving 75% vs on-demand",
        "  Checkpoint: step 35 · oss://bucket/jobs/ft-ab12/checkpoints/checkpoint-35",
        "  Interruptions: 1 · 0 steps lost · 42s downtime",
        "  On-call: acknowledged by dingtalk:manager4220 at 08:30:00 UTC",
    ]
    warning = Notify(job_id="ft-ab12", channel="alert", topic="interruption-warning", fields=dict(TOPICS[0][1]))
    assert message_text(job(), warning, NOW) == (
        "⚠️ Spot interruption warning for ft-ab12 on i-1 (from aws-imds); the machine goes at 08:30:00 UTC. "
        "Checkpointing now."
    )
    assert card_text(job(), NOW, "zh-CN").splitlines()[1] == "  状态: 🟢 运行中"


# -- what the handlers say to a person (handlers/reasons.py), and the bot's answers to commands ------------


def _parse_error(text: str) -> Reason:
    with pytest.raises(UsageError) as caught:
        parse(text)
    return caught.value.reason


def _recipe_error(call: Callable[[], object]) -> Reason:
    with pytest.raises(RecipeError) as caught:
        call()
    return caught.value.reason


def reconcile_reasons() -> list[Reason]:
    """Each reason reconciliation gives, from :func:`handlers.reconcile.reconcile` on a listing that calls for it."""
    running = job().model_copy(update={"updated_at": NOW - timedelta(minutes=1)})
    silent = running.model_copy(update={"updated_at": NOW - timedelta(minutes=40)})
    over = running.model_copy(update={"state": JobState.SUCCEEDED})

    def listed(instance: str, job_id: str, attempt: int | None, state: str = "running") -> CloudInstance:
        return CloudInstance(instance, state, job_id, attempt, launched_at=NOW - timedelta(hours=1))

    cases = [
        ([running], []),  # not-listed
        ([running], [listed("i-2", "ft-ab12", 2, "terminated")]),  # listed-as
        ([silent], [listed("i-2", "ft-ab12", 2)]),  # silent
        ([], [listed("i-9", "ft-zz99", 1)]),  # job-unknown
        ([over], [listed("i-2", "ft-ab12", 2)]),  # job-over
        ([running], [listed("i-2", "ft-ab12", 2), listed("i-1", "ft-ab12", 1)]),  # moved-on
        ([running], [listed("i-2", "ft-ab12", 2), listed("i-1", "ft-ab12", None)]),  # moved-on-untagged
    ]
    reasons = [action.reason for jobs, instances in cases for action in reconcile(jobs, instances, NOW)]
    assert len(reasons) == len(cases)
    return reasons


def handler_reasons() -> list[Reason]:
    """Every kind of Reason the handlers give, each made by the real code path that gives it."""
    running = job().model_copy(update={"state": JobState.RUNNING, "page": None})
    failed = running.model_copy(update={"state": JobState.RESUME_FAILED})
    acked = failed.model_copy(update={"page": Page(attempt=2, opened_at=NOW, reason="x", acked_by="slack:U1")})
    pending = running.model_copy(update={"state": JobState.PENDING, "attempts": []})
    stopped = running.model_copy(update={"state": JobState.STOPPED})
    bare = Recipe(name="bare", description="d", model="m", command=["true"])
    ignored = [
        stop_command(stopped, "slack:U1", NOW),
        drill_command(pending, "slack:U1", NOW),
        ack_command(running, "slack:U1", NOW),
        ack_command(failed, "slack:U1", NOW),
        ack_command(acked, "slack:U2", NOW),
        retry_command(running, "slack:U1", False, NOW),
    ]
    policy = Policy(allow={"start": []}, max_concurrent_jobs=2, max_hourly_price=1.0)
    reasons = [
        HELP_REASON,
        *(_parse_error(text) for text in ("x" * 2001, "deploy prod", "status a b", "resume ft-7k2q now", "start")),
        *(_parse_error(text) for text in ("start BAD/x", "start tiny lr", "start tiny a=1 a=2", "stop job;rm")),
        *(_parse_error(text) for text in ("list all", "logs")),
        _recipe_error(lambda: find_recipe("llama-70b", dict(BUILT_IN))),
        _recipe_error(lambda: TINY.resolve({"batch": "1"})),
        _recipe_error(lambda: bare.resolve({"batch": "1"})),
        _recipe_error(lambda: TINY.resolve_values({"gone": 1})),
        *(_recipe_error(lambda o=o: TINY.resolve(o)) for o in ({"steps": "x"}, {"lr": "x"}, {"lr": "9"}, {"lr": "0"})),
        _recipe_error(lambda: Parameter(type="bool", default=True).parse("flag", "maybe")),
        _recipe_error(lambda: Parameter(type="str", default="a", choices=["a", "b"]).parse("mode", "c")),
        _recipe_error(lambda: Parameter(type="str", default="a").parse("dataset", "a;b")),
        _recipe_error(lambda: Parameter(type="str", default="a").parse("dataset", "--push_to_hub")),
        recipes.WORDING("recipe.not-str", name="mode", raw="x"),  # a str parameter takes any text: never raised
        refusal(policy, "dingtalk:bob", "start"),
        guard_start(policy, active_jobs=2, hourly_price=None),
        guard_start(policy, active_jobs=0, hourly_price=1.5),
        *(change.reason for change in ignored),
        *policy_reasons(),
        *reconcile_reasons(),
    ]
    assert all(reason is not None for reason in reasons)
    return [reason for reason in reasons if reason is not None]


def keys_in(reason: Reason) -> set[str]:
    nested = (keys_in(value) for value in reason.values.values() if isinstance(value, Reason))
    return {reason.key}.union(*nested)


def test_the_english_of_the_handlers_is_the_catalogue_english_and_no_key_is_in_both_tables() -> None:
    tables = [commands.WORDING, policy_module.WORDING, recipes.WORDING, decide.WORDING, job_options.WORDING]
    tables += [spot_policy.WORDING, spot_decide.WORDING, reconcile_module.WORDING]
    assert {key: value for table in tables for key, value in table.sentences.items()} == en.HANDLERS
    assert sum(len(table.sentences) for table in tables) == len(en.HANDLERS)  # no handler key twice
    assert en.BOT.keys().isdisjoint(en.HANDLERS)
    assert all(messages("en")[key] == value for key, value in en.HANDLERS.items())
    assert set(messages("zh-CN")) >= set(en.HANDLERS)


def test_every_reason_renders_in_both_languages_english_exactly_as_str() -> None:
    reasons = handler_reasons()
    assert set().union(*(keys_in(reason) for reason in reasons)) == set(en.HANDLERS)  # every key is exercised
    kept = {*USAGE, *job_options.JOB_OPTIONS, "finetune", "demand"}  # the words a person types stay as they are
    for reason in reasons:
        english, chinese = say("en", reason), say("zh-CN", reason)
        assert english == str(reason) == reason.english
        assert CJK.search(chinese) and not CJK.search(english), reason.key
        literal = "".join(part for part, *_ in string.Formatter().parse(messages("en")[reason.key]))
        leftover = {w for w in re.findall(r"[A-Za-z]{3,}", literal) if w not in kept and w in chinese}
        assert not leftover, (reason.key, chinese, leftover)


def test_help_and_usage_in_chinese_keep_the_words_to_type() -> None:
    english = say("en", HELP_REASON).splitlines()
    assert say("en", HELP_REASON) == HELP and len(english) == len(USAGE)
    for line, (verb, usage) in zip(english, USAGE.items(), strict=True):  # each command, one line saying what
        assert line == f"/finetune {usage} — {commands.DOES[verb]}"
    lines = say("zh-CN", HELP_REASON).splitlines()
    assert [line.split(" —— ")[0].split()[1] for line in lines] == list(USAGE)
    assert lines[-2] == "/finetune resume <任务> [on-demand] —— 从检查点继续失败或已停止的任务（可改用按量付费）"
    assert say("zh-CN", _parse_error("stop a b")) == "stop：需要且只能带一个任务编号。用法：/finetune stop <任务>"
    state = say("zh-CN", stop_command(job().model_copy(update={"state": JobState.STOPPED}), "u", NOW).reason)
    assert state == "任务当前状态为 已停止"  # a job state inside a reason is said in the channel's language


# The bot's own answers, with values as Bot.command gives them: the English as the bot always wrote it.
REPLIES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "reply.starting",
        {"job": "ft-ab12", "recipe": "tiny", "params": "steps=30 lr=0.05"},
        "Starting ft-ab12: tiny (steps=30 lr=0.05)",
        "正在启动 ft-ab12：tiny（steps=30 lr=0.05）",
    ),
    (
        "reply.ok",
        {"action": "stop", "job": "ft-ab12", "state": "STOPPING"},
        "OK: stop ft-ab12 (STOPPING)",
        "已受理：stop ft-ab12（STOPPING）",
    ),
    ("reply.no-job", {"job": "ft-ab12"}, "no job ft-ab12", "找不到任务 ft-ab12"),
    ("reply.refused", {"why": "x"}, "⛔ x", "⛔ x"),  # only a frame: the reason inside is in the language
    ("reply.ignored", {"action": "ack", "job": "ft-ab12", "why": "y"}, "⛔ ack ft-ab12: y", "⛔ ack ft-ab12：y"),
    ("reply.no-jobs", {}, "no jobs yet: /finetune start tiny", "还没有任务：/finetune start tiny"),
    (
        "reply.list-line",
        {"job": "ft-ab12", "state": "RUNNING", "recipe": "tiny", "step": 3, "total": "?"},
        f"{'ft-ab12'}  {'RUNNING':<13} {'tiny':<12} step 3/?",  # the f-string the bot used to write
        "ft-ab12  RUNNING  tiny  第 3/? 步",
    ),
    ("chat.starting", {}, "The bot is still starting; try again in a moment.", "机器人还在启动中，请稍后再试。"),
    ("slack.working", {}, "⏳ Working on it…", "⏳ 正在处理…"),
    (
        "slack.failed",
        {},
        "⚠️ That did not work: the bot hit an internal error (it is logged). Try again in a moment.",
        "⚠️ 操作未成功：机器人内部出错（已记录日志）。请稍后再试。",
    ),
    (
        "slack.bad-button",
        {"value": "x;y"},
        "⛔ that button does not name a job ('x;y')",
        "⛔ 这个按钮没有指明任务（'x;y'）",
    ),
]


@pytest.mark.parametrize(("key", "values", "english", "chinese"), REPLIES, ids=[key for key, *_ in REPLIES])
def test_every_answer_of_the_bot_renders_in_both_languages(
    key: str, values: dict[str, Any], english: str, chinese: str
) -> None:
    assert text("en", key, **values) == english
    assert text("zh-CN", key, **values) == chinese


def test_every_answer_key_of_the_bot_is_tested_above() -> None:
    answers = {key for key in en.BOT if key.startswith("reply.")} | {"chat.starting", "slack.working"}
    assert answers <= {key for key, *_ in REPLIES}


def test_help_lists_the_recipes_with_their_parameters_in_both_languages() -> None:
    custom = Recipe(
        name="qwen-lora",
        description="LoRA of Qwen",
        model="m",
        command=["swift", "{mode}"],
        parameters={"mode": Parameter(type="str", default="a", choices=["a", "b"], help="which")},
    )
    bare = Recipe(name="bare", description="no knobs", model="m", command=["true"])
    for lang in LANGUAGES:
        shown = recipes_text([TINY, custom, bare], lang).splitlines()
        assert [line.split()[0] for line in shown if line.startswith("  ") and not line.startswith("   ")] == [
            "bare",
            "qwen-lora",
            "tiny",
        ]
        assert any(line.strip().startswith("steps=30  int") and "1…10000" in line for line in shown), shown
        assert any(line.strip().startswith("mode=a  str") and "a, b" in line and "which" in line for line in shown)
        assert any("2147483647" in line for line in shown)  # bounds as written, not 2.1e+09
    assert CJK.search(recipes_text([bare], "zh-CN")) and not CJK.search(recipes_text([bare], "en"))
