"""Per-attempt report keys: a runner's key speaks for its own (job, attempt) only, on every route; report fields
have caps; on AWS, reports and cloud events each count only from their own topic."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pydantic import ValidationError

from bot.errors import InputRefused
from bot.report_gate import REFUSED_METRIC, ReportGate
from bot.sources.aws_intake import EVENTS_REFUSED_METRIC, AwsIntake
from bot.sources.sqs import SqsSource
from handlers.clock import utcnow
from handlers.failures import Failure
from handlers.jobs import Attempt
from handlers.messages import CloudEvent, ReportReceived, parse_message
from handlers.report_keys import ReportKeys, Sender, claimed_sender, derive_report_key, verify_report
from handlers.reports import (
    TEXT_CHARS,
    CheckpointSaved,
    Completed,
    Failed,
    Interrupted,
    Progress,
    RunnerReport,
    dump_report,
    parse_report,
)
from handlers.signing import sign
from runner.reports.reporter import Reporter
from runner.reports.sns import SnsTarget
from tests.sns_payloads import spot_warning
from tests.sns_queues import Aws, RecordingBus, until
from tests.test_sqs_source import consuming

MASTER = "the-bots-master-report-secret"
PREFIX = "s3://ft-bucket/jobs/"  # the jobs' prefix: each job's own is PREFIX + <job id> + "/"
SALTS = {("ft-aaaa", 1): "a1" * 16, ("ft-aaaa", 2): "a2" * 16, ("ft-bbbb", 1): "b1" * 16, ("ft-bbbb", 2): "b2" * 16}


def key_of(job_id: str, attempt: int) -> str:
    """What the cloud hands that attempt's runner: its key, from the salt stored with the attempt."""
    return derive_report_key(MASTER, job_id, attempt, SALTS[job_id, attempt])


class Salts:
    """The store's side of the gate (bot.store.JobStore.key_salt) over :data:`SALTS`, counting the look-ups."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, job_id: str, attempt: int) -> str | None:
        self.asked.append((job_id, attempt))
        return SALTS.get((job_id, attempt))


def gate_of(salts: Salts | None = None) -> ReportGate:
    return ReportGate(MASTER, salts or Salts(), lambda job_id: f"{PREFIX}{job_id}/")


def signed(key: str, line: str, now: int | None = None) -> tuple[bytes, str, str]:
    at = int(time.time()) if now is None else now
    return line.encode(), str(at), sign(key, at, line.encode())


# -- the keys ------------------------------------------------------------------------------------------------


def test_each_attempt_has_a_key_of_its_own_and_none_is_the_master() -> None:
    salt = "5a" * 16
    keys = {derive_report_key(MASTER, job, n, salt) for job in ("ft-aaaa", "ft-bbbb") for n in (1, 2, 12)}
    assert len(keys) == 6 and MASTER not in keys
    # The separators keep a job id and an attempt from running into each other.
    assert derive_report_key(MASTER, "ft-abc", 12, salt) != derive_report_key(MASTER, "ft-abc1", 2, salt)
    assert derive_report_key(MASTER, "ft-aaaa", 1, salt) != derive_report_key("another-master", "ft-aaaa", 1, salt)
    assert ReportKeys(MASTER).of("ft-aaaa", 1, salt) == derive_report_key(MASTER, "ft-aaaa", 1, salt)
    assert MASTER not in repr(ReportKeys(MASTER))
    with pytest.raises(ValueError):
        ReportKeys("")


def test_a_key_follows_from_its_attempts_salt_not_from_the_job_id_and_number_alone() -> None:
    # The same job id and number with another salt (a record written again, an id used again): another key.
    assert derive_report_key(MASTER, "ft-aaaa", 1, "a1" * 16) != derive_report_key(MASTER, "ft-aaaa", 1, "a2" * 16)
    # Every attempt draws its own salt when it is planned, and keeps it in the job's record.
    first, second = Attempt(number=1), Attempt(number=1)
    assert first.key_salt != second.key_salt and len(first.key_salt) == 32
    assert Attempt.model_validate_json(first.model_dump_json()).key_salt == first.key_salt
    assert first.model_copy(update={"ended_at": utcnow()}).key_salt == first.key_salt
    for bad in ("", "A1" * 16, "a1" * 15, "a1" * 16 + "\n"):
        with pytest.raises(ValueError):
            derive_report_key(MASTER, "ft-aaaa", 1, bad)


def test_a_report_counts_only_with_the_key_of_the_attempt_it_names() -> None:
    line = dump_report(Progress(job_id="ft-bbbb", attempt=2, step=5))
    now = time.time()
    sender, salt = Sender("ft-bbbb", 2), SALTS["ft-bbbb", 2]
    own = signed(key_of("ft-bbbb", 2), line)
    assert verify_report(MASTER, sender, salt, *own, now) is None
    for key in (
        key_of("ft-aaaa", 2),  # another job's runner
        key_of("ft-bbbb", 1),  # the same job's older attempt
        derive_report_key(MASTER, "ft-bbbb", 2, "0f" * 16),  # this attempt number under another salt
        MASTER,  # the bot's own secret is no runner's key
    ):
        why = verify_report(MASTER, sender, salt, *signed(key, line), now)
        assert why is not None and "ft-bbbb attempt 2" in why
    body, stamp, signature = own
    assert verify_report(MASTER, sender, salt, body, None, signature, now) == "unsigned"
    assert verify_report(MASTER, sender, salt, body, stamp, None, now) == "unsigned"
    assert verify_report(MASTER, sender, salt, body, stamp, signature, now + 3600) is not None  # a replay, too late
    changed = body.replace(b'"step":5', b'"step":6')
    assert verify_report(MASTER, sender, salt, changed, stamp, signature, now) is not None


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1]",
        b'{"attempt": 1}',
        b'{"job_id": "ft-aaaa"}',
        b'{"job_id": "FT-A", "attempt": 1}',
        b'{"job_id": "ft-aaaa", "attempt": true}',
        b'{"job_id": "ft-aaaa", "attempt": 0}',
    ],
)
async def test_a_body_naming_no_attempt_has_no_key_to_check(body: bytes) -> None:
    assert claimed_sender(body) is None
    salts = Salts()
    with pytest.raises(InputRefused) as refused:
        await gate_of(salts).admit(body, "1", "v1=00", route="http")
    assert "names no job and attempt" in refused.value.reason and salts.asked == []  # nothing to look up


async def test_the_gate_counts_what_it_refuses_and_names_the_attempt_in_the_bus_id() -> None:
    salts = Salts()
    gate = gate_of(salts)
    report = Progress(job_id="ft-bbbb", attempt=1, step=5)
    message = await gate.admit(*signed(key_of("ft-bbbb", 1), dump_report(report)), route="http")
    assert message.report == report and message.id == f"report:ft-bbbb:1:{report.id}"
    assert salts.asked == [("ft-bbbb", 1)]  # the key comes from the salt stored with the attempt
    with pytest.raises(InputRefused) as unsigned:
        await gate.admit(dump_report(report).encode(), None, None, route="sqs")
    assert unsigned.value.status == 401 and salts.asked == [("ft-bbbb", 1)]  # unsigned: no look-up
    malformed = dump_report(report).replace('"step":5', '"step":"five"')
    with pytest.raises(InputRefused) as bad:
        await gate.admit(*signed(key_of("ft-bbbb", 1), malformed), route="http")
    assert bad.value.status == 400 and bad.value.detail  # signed by its attempt, but not a report: 400, not 401
    assert gate.refused == {"sqs": 1, "http": 1} and gate.metrics() == {REFUSED_METRIC: 2.0}


async def test_the_gate_refuses_an_attempt_the_store_does_not_hold_whatever_key_signed_it() -> None:
    gate = gate_of()
    stranger = Progress(job_id="ft-cccc", attempt=1, step=5)  # no such attempt: no salt, so no key
    for salt in ("a1" * 16, "00" * 16):
        with pytest.raises(InputRefused) as refused:
            key = derive_report_key(MASTER, "ft-cccc", 1, salt)
            await gate.admit(*signed(key, dump_report(stranger)), route="http")
        assert refused.value.status == 401 and "ft-cccc has no attempt 1" in refused.value.reason
    unplanned = Progress(job_id="ft-bbbb", attempt=3, step=5)
    with pytest.raises(InputRefused, match="ft-bbbb has no attempt 3") as refused:
        key = derive_report_key(MASTER, "ft-bbbb", 3, "b1" * 16)
        await gate.admit(*signed(key, dump_report(unplanned)), route="sqs")
    assert refused.value.status == 401


@pytest.mark.parametrize(
    "report",
    [
        Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-aaaa/output/"),  # another job's
        Completed(job_id="ft-bbbb", attempt=1, output_uri="https://example.com/ft-bbbb/output/"),
        Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-bbbb/../ft-aaaa/output/"),
        Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-bbbb/%2e%2e/ft-aaaa/"),
        Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-bbbb"),  # the prefix's sibling
        Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-bbbbx/output/"),
        CheckpointSaved(job_id="ft-bbbb", attempt=1, step=4, uri="s3://elsewhere/ckpt/", bytes=1, seconds=1.0),
        Interrupted(job_id="ft-bbbb", attempt=1, reason="r", step=4, uri="file:///etc/"),
    ],
)
async def test_a_report_naming_storage_outside_its_jobs_prefix_is_refused(report: RunnerReport) -> None:
    gate = gate_of()
    with pytest.raises(InputRefused) as refused:
        await gate.admit(*signed(key_of("ft-bbbb", 1), dump_report(report)), route="http")
    assert refused.value.status == 400 and refused.value.detail == [{"loc": ["uri"], "msg": "outside the job's prefix"}]
    assert "outside the job's prefix s3://ft-bucket/jobs/ft-bbbb/" in refused.value.reason
    own = Completed(job_id="ft-bbbb", attempt=1, output_uri="s3://ft-bucket/jobs/ft-bbbb/output/")
    assert (await gate.admit(*signed(key_of("ft-bbbb", 1), dump_report(own)), route="http")).report == own


# -- the caps ------------------------------------------------------------------------------------------------


CRASHED = {"code": "trainer-exited-silent", "values": {"exit_code": 1, "restarts": 0}}


def test_every_report_string_and_list_has_a_cap_refused_on_the_wire() -> None:
    base = {"job_id": "ft-aaaa", "attempt": 1}
    too_much: list[dict[str, Any]] = [
        {**base, "type": "failed", "failure": CRASHED, "log_tail": ["line"] * 51},
        {**base, "type": "failed", "failure": CRASHED, "log_tail": ["x" * (TEXT_CHARS + 1)]},
        {
            **base,
            "type": "failed",
            "failure": {"code": "storage-unreachable", "values": {"error": "e" * 5000}},
        },
        {**base, "type": "warning", "kind": "k" * 65, "message": "m"},
        {**base, "type": "warning", "kind": "k", "message": "m" * (TEXT_CHARS + 1)},
        {**base, "type": "completed", "output_uri": "s3://b/" + "o" * 2048},
        {**base, "type": "started", "instance_id": "i-" + "0" * 63},
        {**base, "type": "started", "skipped": [{"step": 1, "uri": "u", "reason": "r", "kind": "missing"}] * 65},
        {**base, "type": "notice", "kind": "spot-interruption", "source": "s" * 65},
        {**base, "type": "interrupted", "reason": "r", "committing": list(range(65))},
        {**base, "type": "interrupted", "reason": "r", "seconds": {str(n): 1.0 for n in range(65)}},
        {**base, "type": "interrupted", "reason": "r", "given_up": [{"reason": "x" * (TEXT_CHARS + 1)}]},
        {**base, "type": "interrupted", "reason": "r", "late": {"cause": "upload-failed", "error": "e" * 5000}},
        {**base, "type": "checkpoint_saved", "step": 1, "uri": "u" * 2049, "bytes": 1, "seconds": 1.0},
        {**base, "id": "i" * 65, "type": "progress", "step": 1},
    ]
    for raw in too_much:
        with pytest.raises(ValidationError):
            parse_report(json.dumps(raw))
        with pytest.raises(ValidationError):
            parse_report(raw)


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "failed", "reason": "trainer exited with code 3"},  # a sentence without its failure code
        {"type": "failed", "failure": CRASHED, "reason": "trainer exited with code 1"},  # the same, said twice
        {"type": "notice", "kind": "termination", "source": "aliyun-metadata"},  # a kind under another name
        {"type": "started", "skipped": [{"step": 1, "uri": "u", "reason": "r"}]},  # a skip without its kind
        {"type": "progress", "step": 1, "note": "x"},  # a field no report has
        {"type": "interrupted", "reason": "r", "late": {"cause": "not-saved", "fallback": True}},
    ],
)
def test_a_report_in_any_spelling_but_the_one_is_refused_on_the_wire(raw: dict[str, Any]) -> None:
    """Nothing a runner sends is read under another name or silently dropped: it is refused, as malformed."""
    report = {"job_id": "ft-aaaa", "attempt": 1, **raw}
    with pytest.raises(ValidationError):
        parse_report(json.dumps(report))
    with pytest.raises(ValidationError):
        parse_report(report)


def test_the_runner_clips_its_own_reports_to_the_caps_so_it_can_always_report() -> None:
    failed = Failed(
        job_id="ft-aaaa",
        attempt=1,
        log_tail=[f"line {n} " + "x" * 5000 for n in range(80)],
        failure=Failure.of("storage-unreachable", error="e" * 9000),
    )
    assert len(failed.log_tail) == 50
    assert failed.log_tail[-1].startswith("line 79 ") and all(len(line) == TEXT_CHARS for line in failed.log_tail)
    assert len(str(failed.failure.values["error"])) == TEXT_CHARS
    assert parse_report(dump_report(failed)) == failed  # what the runner sends, the bot takes
    interrupted = Interrupted(job_id="ft-aaaa", attempt=1, reason="r", committing=list(range(100)))
    assert interrupted.committing == list(range(36, 100))  # the newest uploads in flight


# -- AWS: each topic carries what it may, and reports are signed -----------------------------------------------


async def test_on_sqs_reports_count_only_from_the_report_topic_signed_by_their_attempt(aws: str) -> None:
    cloud = Aws(aws)
    dead_letters = cloud.queue("finetune-intake-dlq")
    queue = cloud.queue("finetune-intake", dlq_arn=cloud.arn(dead_letters))
    events_topic = cloud.sns.create_topic(Name="finetune-events")["TopicArn"]
    report_topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(events_topic, queue)
    cloud.subscribe(report_topic, queue)
    async def publish(topic: str, report: Progress, key: str | None) -> None:
        """As the runner publishes (runner/reports/sns.py), with ``key``; None: unsigned."""
        if key is None:
            cloud.sns.publish(TopicArn=topic, Message=dump_report(report))
            return
        reporter = Reporter([SnsTarget("sns:" + topic, key)])
        reporter.start()
        reporter.emit(report)
        assert await reporter.drain(10)
        await reporter.aclose()

    good = Progress(job_id="ft-bbbb", attempt=1, step=4)
    await publish(report_topic, good, key_of("ft-bbbb", 1))
    await publish(report_topic, Progress(job_id="ft-bbbb", attempt=1, step=5), None)
    await publish(report_topic, Progress(job_id="ft-bbbb", attempt=1, step=6), key_of("ft-aaaa", 1))
    # Signed correctly, but on the events topic: not where reports come from.
    await publish(events_topic, Progress(job_id="ft-bbbb", attempt=1, step=7), key_of("ft-bbbb", 1))
    # A cloud event on the report topic (every runner may publish there): not believed either.
    cloud.sns.publish(TopicArn=report_topic, Message=spot_warning("i-0forged"))
    cloud.sns.publish(TopicArn=events_topic, Message=spot_warning("i-0real"))

    gate = gate_of()
    intake = AwsIntake(gate, report_topics=[report_topic], events_topics=[events_topic])
    bus = RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1, parse=intake.parse)
    async with consuming(source):
        await until(lambda: source.stats.deleted == 6, what="every message handled")

    published = [parse_message(event) for event in bus.events]
    reports = [message.report for message in published if isinstance(message, ReportReceived)]
    events = [message.instance_id for message in published if isinstance(message, CloudEvent)]
    assert reports == [good] and events == ["i-0real"]
    assert (source.stats.refused, source.stats.published, source.stats.unrecognised) == (4, 2, 0)
    assert gate.refused == {"sqs": 3} and intake.events_refused == {"sqs": 1}
    assert {**gate.metrics(), **intake.metrics()} == {REFUSED_METRIC: 3.0, EVENTS_REFUSED_METRIC: 1.0}
    assert cloud.depth(queue) == 0  # refused messages moved to the dead-letter queue, not left to come back
    assert source.stats.dead_lettered == cloud.depth(dead_letters) == 4


async def test_without_an_events_topic_configured_a_report_topic_still_carries_no_cloud_event() -> None:
    intake = AwsIntake(gate_of(), report_topics=["arn:aws:sns:us-east-1:1:reports"])
    envelope = {
        "Type": "Notification",
        "MessageId": "m-1",
        "TopicArn": "arn:aws:sns:us-east-1:1:reports",
        "Message": spot_warning("i-0forged"),
    }
    with pytest.raises(InputRefused, match="which is not an events topic"):
        await intake.parse(json.dumps(envelope))
    [event] = await intake.parse(json.dumps({**envelope, "TopicArn": "arn:aws:sns:us-east-1:1:events"}))
    assert isinstance(event, CloudEvent) and event.instance_id == "i-0forged"
    # No envelope (EventBridge straight to the queue, whose policy decides who may send): an event is taken.
    [direct] = await intake.parse(spot_warning("i-0direct"))
    assert isinstance(direct, CloudEvent)
