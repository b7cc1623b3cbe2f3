"""The message catalogue: every topic in both languages, the languages in step, English as it always was."""

from __future__ import annotations

import re
import string
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.chat.catalog import LANGUAGES, messages
from bot.chat.render import card, card_text, message_text
from handlers.jobs import Attempt, CheckpointRef, Job, JobState, Page
from handlers.messages import Notify

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
    ("stop-failed", {"reason": "no such instance"}),
    ("drill-failed", {"reason": "FIS refused"}),
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
