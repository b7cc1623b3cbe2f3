"""The freshness rule of runner reports (handlers/report_freshness.py): a queued report is judged against when its
queue received it, a report sent straight to the bot against the bot's clock; and the report gate applies it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from bot.errors import InputRefused
from bot.report_gate import ReportGate
from bot.sources.aws_intake import AwsIntake
from handlers.aws_events import unwrap
from handlers.ids import new_job_id
from handlers.messages import ReportReceived
from handlers.report_freshness import DAY, MAX_QUEUED_SECONDS, REPORT_SEEN_SECONDS, signed_at, why_stale
from handlers.report_keys import Sender, derive_report_key, verify_report
from handlers.reports import SIGNATURE_ATTRIBUTE, TIMESTAMP_ATTRIBUTE, Completed, dump_report
from handlers.signing import TOLERANCE_SECONDS, sign

MASTER = "master-report-secret"
REPORTS = "arn:aws:sns:us-east-1:123456789012:finetune-reports"
JOB = new_job_id()
SIGNED = 1_790_000_000  # when the runner signed
TEN_MINUTES = 600
SALT = "5a" * 16  # the key salt the store holds for the attempt


async def salts(job_id: str, attempt: int) -> str | None:
    """The store's side of the gate: every attempt here has :data:`SALT`."""
    return SALT


def gate_at(now: float) -> ReportGate:
    return ReportGate(MASTER, salts, lambda job_id: f"s3://bucket/jobs/{job_id}/", clock=lambda: now)


def test_a_report_sent_straight_to_the_bot_keeps_the_tight_window() -> None:
    assert why_stale(SIGNED, now=SIGNED + TOLERANCE_SECONDS, queued_at=None) is None
    assert why_stale(SIGNED, now=SIGNED - TOLERANCE_SECONDS, queued_at=None) is None
    late = why_stale(SIGNED, now=SIGNED + TEN_MINUTES, queued_at=None)
    assert late == f"signed 600 s before it arrived (the window is {TOLERANCE_SECONDS} s)"
    ahead = why_stale(SIGNED, now=SIGNED - TOLERANCE_SECONDS - 1, queued_at=None)
    assert ahead is not None and "after it arrived" in ahead


@pytest.mark.parametrize("waited", [TEN_MINUTES, DAY, 13 * DAY, MAX_QUEUED_SECONDS])
def test_a_queued_report_is_judged_by_when_the_queue_received_it_however_long_it_waited(waited: int) -> None:
    assert why_stale(SIGNED, now=SIGNED + waited, queued_at=SIGNED + 2) is None
    assert why_stale(SIGNED, now=SIGNED + waited, queued_at=SIGNED + TOLERANCE_SECONDS) is None


def test_a_report_signed_long_before_its_queue_received_it_is_stale() -> None:
    """A captured report published again: SNS takes the copy now, the signature is from then."""
    why = why_stale(SIGNED, now=SIGNED + TEN_MINUTES, queued_at=SIGNED + TEN_MINUTES)
    assert why == f"signed 600 s before the queue received it (the window is {TOLERANCE_SECONDS} s)"
    assert why_stale(SIGNED, now=SIGNED + 3 * DAY, queued_at=SIGNED + TOLERANCE_SECONDS + 1) is not None
    early = why_stale(SIGNED, now=SIGNED + DAY, queued_at=SIGNED - TOLERANCE_SECONDS - 1)
    assert early is not None and "after the queue received it" in early


def test_a_queue_time_beyond_any_retention_or_ahead_of_the_clock_is_refused() -> None:
    old = why_stale(SIGNED, now=SIGNED + MAX_QUEUED_SECONDS + 1, queued_at=SIGNED)
    assert old is not None and "longer than any queue keeps a message" in old
    ahead = why_stale(SIGNED, now=SIGNED - TOLERANCE_SECONDS - 1, queued_at=SIGNED)
    assert ahead is not None and "ahead of the bot's clock" in ahead
    assert why_stale(SIGNED, now=SIGNED - TOLERANCE_SECONDS, queued_at=SIGNED) is None


def test_an_applied_report_is_remembered_past_every_delivery_the_rule_accepts() -> None:
    """The seen-mark is set when the report is applied (at or after its queue received it) and must outlive the last
    moment a delivery of it could still pass: queued + the longest retention (SQS's maximum is 14 days)."""
    assert MAX_QUEUED_SECONDS == 14 * DAY
    assert REPORT_SEEN_SECONDS > MAX_QUEUED_SECONDS + TOLERANCE_SECONDS


@pytest.mark.parametrize("timestamp", ["", "abc", "1e9", "-5", "٣٣", "1" * 13, "12 "])
def test_only_a_timestamp_of_the_signatures_form_has_a_time(timestamp: str) -> None:
    assert signed_at(timestamp) is None
    assert signed_at("1790000000") == SIGNED


# -- the gate: a report's own signature, judged at its queue's time ---------------------------------------------


def completed() -> bytes:
    return dump_report(Completed(job_id=JOB, attempt=1, step=30, output_uri=f"s3://bucket/jobs/{JOB}/")).encode()


def signed(body: bytes, at: int = SIGNED, key: str | None = None) -> tuple[str, str]:
    key = key or derive_report_key(MASTER, JOB, 1, SALT)
    return str(at), sign(key, at, body)


async def test_the_gate_takes_a_report_ten_minutes_after_signing_when_its_queue_received_it_in_time() -> None:
    body = completed()
    gate = gate_at(SIGNED + TEN_MINUTES)
    timestamp, signature = signed(body)
    message = await gate.admit(body, timestamp, signature, route="sqs", queued_at=SIGNED + 1)
    assert isinstance(message.report, Completed) and message.report.job_id == JOB
    with pytest.raises(InputRefused, match="signed 600 s before it arrived"):  # the same, straight over HTTP
        await gate.admit(body, timestamp, signature, route="http")
    with pytest.raises(InputRefused, match="before the queue received it"):  # published again, ten minutes on
        await gate.admit(body, timestamp, signature, route="sqs", queued_at=SIGNED + TEN_MINUTES)
    assert gate.refused == {"http": 1, "sqs": 1}


def test_a_fresh_timestamp_does_not_excuse_a_wrong_key() -> None:
    body = completed()
    timestamp, signature = signed(body, key=derive_report_key(MASTER, "ft-other", 1, SALT))
    sender, later = Sender(JOB, 1), SIGNED + TEN_MINUTES
    why = verify_report(MASTER, sender, SALT, body, timestamp, signature, later, queued_at=SIGNED)
    assert why == f"not signed with the key of {JOB} attempt 1"
    assert verify_report(MASTER, sender, SALT, body, *signed(body), later, queued_at=SIGNED) is None


# -- which time is the queue's ---------------------------------------------------------------------------------


def envelope(message: bytes, timestamp: str | None, attributes: dict[str, str]) -> str:
    document: dict[str, object] = {
        "Type": "Notification",
        "MessageId": "0f6a1f5e-0000-4000-8000-000000000001",
        "TopicArn": REPORTS,
        "Message": message.decode(),
        "MessageAttributes": {name: {"Type": "String", "Value": value} for name, value in attributes.items()},
    }
    if timestamp is not None:
        document["Timestamp"] = timestamp
    return json.dumps(document)


def test_the_queue_time_is_the_envelopes_timestamp_else_the_sqs_sent_time() -> None:
    body = completed()
    published = datetime.fromtimestamp(SIGNED + 1, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    sent_by_sqs = float(SIGNED + 400)  # SNS retried its delivery to SQS: the envelope says when SNS took it
    assert unwrap(envelope(body, published, {}), {}, sent_by_sqs).queued_at == SIGNED + 1
    assert unwrap(envelope(body, None, {}), {}, sent_by_sqs).queued_at == sent_by_sqs
    assert unwrap(body, {}, sent_by_sqs).queued_at == sent_by_sqs  # raw delivery: no envelope
    assert unwrap(body, {}).queued_at is None


async def test_the_aws_intake_judges_a_report_by_its_queue_time() -> None:
    body = completed()
    timestamp, signature = signed(body)
    attributes = {TIMESTAMP_ATTRIBUTE: timestamp, SIGNATURE_ATTRIBUTE: signature, "finetune_report": "completed"}
    gate = gate_at(SIGNED + TEN_MINUTES)
    intake = AwsIntake(gate, report_topics=[REPORTS])
    published = datetime.fromtimestamp(SIGNED, UTC).isoformat()
    [taken] = await intake.parse(envelope(body, published, attributes))
    assert isinstance(taken, ReportReceived) and taken.report.type == "completed"
    [raw] = await intake.parse(body, attributes, float(SIGNED + 3))  # raw delivery: SQS's sent time
    assert raw.id == taken.id
    again = datetime.fromtimestamp(SIGNED + TEN_MINUTES, UTC).isoformat()
    with pytest.raises(InputRefused, match="before the queue received it"):
        await intake.parse(envelope(body, again, attributes))
    with pytest.raises(InputRefused, match="before it arrived"):  # raw, no sent time known: the bot's clock
        await intake.parse(body, attributes)
