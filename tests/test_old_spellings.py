"""Every old spelling the project still reads (handlers/old_spellings.py), each at its one edge: read as today's
word, with one deprecation line in the log per process and spelling; today's words are read without one."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from bot.chat.slack.actions import ACTION_IDS, COMMANDS, current_action_id
from bot.chat.slack.blocks import ACTION_INTERRUPT_TEST, ACTION_RESUME
from bot.settings import parse_file_config
from handlers import old_spellings
from handlers.messages import InterruptTest, Notify, parse_message
from handlers.notes import CardRefresh, InterruptTestStarted
from handlers.reports import InstanceNotice, Notice, parse_report
from handlers.spec import (
    InterruptTestControl,
    ReleaseAwsAutoScaling,
    ReleaseAwsInstance,
    StopControl,
    dump_control,
    parse_control,
    parse_spec,
)

DEADLINE = "2026-12-02T10:00:00Z"
SPEC = {
    "version": 1,
    "job_id": "ft-ab12",
    "attempt": 1,
    "command": ["python", "train.py"],
    "checkpoint_uri": "s3://bucket/jobs/ft-ab12/",
}


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    old_spellings.forget()
    yield
    old_spellings.forget()


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [r for r in caplog.records if r.name == "handlers.old_spellings" and r.levelno == logging.WARNING]
    return [record.getMessage() for record in said]


# -- the control object -----------------------------------------------------------------------------------------


def test_the_control_object_is_written_with_type_and_read_without_a_deprecation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deadline = datetime(2026, 12, 2, 10, tzinfo=UTC)
    written = json.loads(dump_control(InterruptTestControl(deadline=deadline)))
    assert written == {"type": "interrupt-test", "deadline": "2026-12-02T10:00:00Z"}
    assert json.loads(dump_control(StopControl())) == {"type": "stop"}
    with caplog.at_level(logging.WARNING):
        assert parse_control(json.dumps(written)) == InterruptTestControl(deadline=deadline)
    assert deprecations(caplog) == []


@pytest.mark.parametrize(
    ("old", "expected", "said"),
    [
        ({"action": "drill", "deadline": DEADLINE}, InterruptTestControl, ["action", "drill"]),
        ({"action": "stop"}, StopControl, ["action"]),
    ],
)
def test_a_control_object_an_older_bot_wrote_is_still_obeyed(
    caplog: pytest.LogCaptureFixture, old: dict[str, str], expected: type, said: list[str]
) -> None:
    with caplog.at_level(logging.WARNING):
        assert isinstance(parse_control(json.dumps(old)), expected)
        parse_control(json.dumps(old))  # the same spelling again, in the same process: no second line
    lines = deprecations(caplog)
    assert len(lines) == len(said)
    assert all(f"'{word}'" in line for word, line in zip(said, lines, strict=True))
    assert "'type'" in lines[0] and "control object" in lines[0]


def test_a_control_object_of_an_unknown_type_is_still_refused() -> None:
    for bad in ({"action": "explode"}, {"action": "drill"}, {"action": "stop", "type": "x"}, {"type": "stop", "x": 1}):
        with pytest.raises(ValueError):
            parse_control(json.dumps(bad))


# -- the spec's release ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ({"kind": "aws-instance"}, ReleaseAwsInstance(type="aws-instance")),
        ({"kind": "aws-autoscaling", "group": "ft-g"}, ReleaseAwsAutoScaling(type="aws-autoscaling", group="ft-g")),
    ],
)
def test_a_spec_an_older_bot_stored_with_release_kind_still_reads(
    caplog: pytest.LogCaptureFixture, release: dict[str, str], expected: object
) -> None:
    with caplog.at_level(logging.WARNING):
        assert parse_spec(json.dumps({**SPEC, "release": release})).release == expected
    [line] = deprecations(caplog)
    assert "spec.release" in line and "'kind'" in line and "'type'" in line
    # Written today: ``type``, and read without a line.
    caplog.clear()
    today = parse_spec(json.dumps({**SPEC, "release": json.loads(expected.model_dump_json())}))  # type: ignore[attr-defined]
    assert json.loads(today.model_dump_json())["release"]["type"] == release["kind"]
    assert deprecations(caplog) == []


# -- a runner's notice ----------------------------------------------------------------------------------------------


def test_an_older_alibaba_runners_termination_notice_reads_as_a_spot_interruption(
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = {
        "type": "notice",
        "id": "notice-0001",
        "job_id": "ft-ab12",
        "attempt": 1,
        "time": DEADLINE,
        "kind": "termination",
        "source": "aliyun-metadata",
        "deadline": DEADLINE,
    }
    with caplog.at_level(logging.WARNING):
        notice = parse_report(json.dumps(report))
    assert isinstance(notice, Notice) and notice.kind == "spot-interruption" and notice.interrupts
    [line] = deprecations(caplog)
    assert "notice.kind" in line and "'termination'" in line and "'spot-interruption'" in line


def test_an_older_runners_drill_source_reads_as_an_interrupt_test(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        notice = InstanceNotice.model_validate({"kind": "spot-interruption", "source": "drill", "deadline": DEADLINE})
    assert notice.source == "interrupt-test"
    [line] = deprecations(caplog)
    assert "notice.source" in line and "'drill'" in line


# -- bus messages already on a stream -------------------------------------------------------------------------------


def test_a_drill_message_and_a_notify_with_a_topic_on_a_stream_at_upgrade_still_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        drill = parse_message({"kind": "drill", "job_id": "ft-ab12", "instance_id": "i-1", "requested_by": "slack:U1"})
        started = parse_message(
            {
                "kind": "notify",
                "job_id": "ft-ab12",
                "channel": "thread",
                "topic": "interrupt-test-started",
                "fields": {"instance": "i-1", "by": "slack:U1"},
            }
        )
        card = parse_message({"kind": "notify", "job_id": "ft-ab12", "channel": "card", "topic": "card", "fields": {}})
    assert isinstance(drill, InterruptTest) and drill.instance_id == "i-1"
    assert isinstance(started, Notify) and started.note == InterruptTestStarted(instance="i-1", by="slack:U1")
    assert started.note_type == "interrupt-test-started"
    assert isinstance(card, Notify) and card.note == CardRefresh(cause="refresh")
    lines = deprecations(caplog)
    assert any("'drill'" in line for line in lines) and any("'topic'" in line for line in lines)


# -- the config file ------------------------------------------------------------------------------------------------


def test_a_config_file_with_the_older_interrupt_test_keys_still_loads(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "aws:\n  bucket: my-finetune-checkpoints\n  image_id: ami-0abc\n"
        "  drill_notice: PT5M\n"
        "aliyun:\n  region: cn-hangzhou\n  bucket: my-oss-bucket\n  image_id: m-abc\n"
        "  vswitches: {cn-hangzhou-h: vsw-1}\n"
        "  drill_grace_seconds: 30\n"
    )
    with caplog.at_level(logging.WARNING):
        config = parse_file_config(text, "bot.yaml")
    assert config.aws is not None and config.aws.interrupt_test_notice == "PT5M"
    assert config.aliyun is not None and config.aliyun.interrupt_test_grace_seconds == 30
    lines = deprecations(caplog)
    assert any("'drill_notice'" in line and "'interrupt_test_notice'" in line for line in lines)
    assert any("'drill_grace_seconds'" in line and "'interrupt_test_grace_seconds'" in line for line in lines)


def test_a_config_file_with_todays_keys_loads_without_a_deprecation(caplog: pytest.LogCaptureFixture) -> None:
    text = "aws:\n  bucket: my-finetune-checkpoints\n  image_id: ami-0abc\n  interrupt_test_notice: PT1M\n"
    with caplog.at_level(logging.WARNING):
        config = parse_file_config(text, "bot.yaml")
    assert config.aws is not None and config.aws.interrupt_test_notice == "PT1M"
    assert deprecations(caplog) == []


def test_a_config_file_with_both_spellings_is_refused_not_guessed() -> None:
    text = "aws:\n  bucket: my-finetune-checkpoints\n  image_id: ami-0abc\n  drill_notice: PT5M\n"
    text += "  interrupt_test_notice: PT1M\n"
    with pytest.raises(Exception, match="drill_notice"):
        parse_file_config(text, "bot.yaml")


# -- Slack buttons on messages already in channels ------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [("finetune_drill", ACTION_INTERRUPT_TEST), ("finetune_retry", ACTION_RESUME)])
def test_an_old_messages_button_still_runs_its_command(caplog: pytest.LogCaptureFixture, old: str, new: str) -> None:
    assert ACTION_IDS.fullmatch(old)  # the Slack app still routes it to the handler
    with caplog.at_level(logging.WARNING):
        assert current_action_id(old) == new and new in COMMANDS
    [line] = deprecations(caplog)
    assert "slack button" in line and f"'{old}'" in line and f"'{new}'" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert current_action_id(new) == new
    assert deprecations(caplog) == []


def test_nothing_writes_an_old_spelling() -> None:
    """The mappings only read: today's models refuse to be built with an old word."""
    olds: list[Any] = [
        lambda: InterruptTestControl.model_validate({"type": "drill", "deadline": DEADLINE}),
        lambda: ReleaseAwsInstance.model_validate({"type": "termination"}),
    ]
    for build in olds:
        with pytest.raises(ValueError):
            build()
