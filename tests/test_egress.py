"""What moving checkpoints between regions costs a job: the arithmetic, the decision that counts the bytes, and the
words (the card's ``egress $…``, the ``costs`` line), in English and Chinese."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.chat.catalog import Lang
from bot.chat.costs import costs_text
from bot.chat.render import card_text
from handlers.cost_report import cost_report, report_json
from handlers.decide.dispatch import decide
from handlers.egress import attempt_egress, egress_price, moved_bytes, with_moved_bytes
from handlers.job_cost import job_cost
from handlers.jobs import Attempt, JobState
from handlers.messages import Launched, ReportReceived
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB
from handlers.reports import CheckpointSaved, Progress, Started
from tests.test_job_cost import at, worked_example

GB = 10**9


def test_only_an_attempt_outside_the_home_region_pays_for_what_it_moves() -> None:
    assert egress_price("us-west-2b", "us-east-1", 0.02) == 0.02
    assert egress_price("us-east-1a", "us-east-1", 0.02) == 0.0
    assert egress_price("cn-shanghai-b", "cn-hangzhou", 0.08) == 0.08
    assert egress_price("cn-hangzhou-h", "cn-hangzhou", 0.08) == 0.0
    assert egress_price(None, "us-east-1", 0.02) == egress_price("us-west-2b", "", 0.02) == 0.0  # nothing known


def test_a_200_gb_checkpoint_restored_and_committed_once_across_regions_costs_eight_dollars() -> None:
    """The issue's figure: 200 GB each way at AWS's $0.02 per GB."""
    away = Attempt(number=2, egress_price_per_gb=AWS_TRANSFER_PRICE_PER_GB, moved_bytes=400 * GB)
    assert attempt_egress(away) == pytest.approx(8.0)
    assert attempt_egress(away.model_copy(update={"egress_price_per_gb": 0.0})) == 0.0


def test_the_job_pays_its_egress_on_top_of_its_hours_and_its_saving_shrinks() -> None:
    plain = worked_example()
    first, second = plain.attempts
    moved = plain.model_copy(
        update={
            "attempts": [
                first.model_copy(update={"moved_bytes": 50 * GB}),  # at home: free
                second.model_copy(update={"moved_bytes": 25 * GB, "egress_price_per_gb": 0.02}),
            ]
        }
    )
    before, after = job_cost(plain, at(300)), job_cost(moved, at(300))
    assert before.egress == 0.0 and after.egress == pytest.approx(0.50)
    assert after.paid == pytest.approx(before.paid + 0.50) and after.hours == before.hours
    assert after.savings is not None and before.savings is not None and after.savings < before.savings


def test_started_and_committed_bytes_count_on_their_attempt_whatever_the_decision_makes_of_them() -> None:
    job = worked_example(state=JobState.RUNNING, attempt=2, step=150)
    job = job.model_copy(update={"attempts": [job.attempts[0], job.attempts[1].model_copy(update={"ended_at": None})]})
    restored = Started(job_id=job.id, attempt=2, restored_bytes=7 * GB, time=at(136))
    uri = "s3://b/j/checkpoint-150/"
    committed = CheckpointSaved(job_id=job.id, attempt=2, step=150, uri=uri, bytes=3 * GB, seconds=1)
    late = CheckpointSaved(job_id=job.id, attempt=1, step=120, uri=uri, bytes=2 * GB, seconds=1)
    assert [moved_bytes(r) for r in (restored, committed, late)] == [7 * GB, 3 * GB, 2 * GB]
    assert moved_bytes(Progress(job_id=job.id, attempt=2, step=151)) == 0
    for report in (committed, late):  # the current attempt's and an older one's (fenced: the decision ignores it)
        change = decide(job, ReportReceived(report=report), at(200))
        assert change is not None
        job = change.job
    assert [a.moved_bytes for a in job.attempts] == [2 * GB, 3 * GB]
    assert with_moved_bytes(job, Started(job_id=job.id, attempt=9, restored_bytes=GB)) == job  # no such attempt
    ahead = job.model_copy(update={"standby": Attempt(number=3, instance_id="i-3")})
    standby = with_moved_bytes(ahead, restored.model_copy(update={"attempt": 3})).standby
    assert standby is not None and standby.moved_bytes == 7 * GB


def test_the_launch_fixes_the_attempts_price_per_gb() -> None:
    job = worked_example(state=JobState.RECOVERING, attempt=2)
    job = job.model_copy(
        update={"attempts": [job.attempts[0], Attempt(number=2, launched_at=at(130))], "updated_at": at(130)}
    )
    launched = Launched(job_id=job.id, attempt=2, instance_id="i-2", zone="us-west-2b", egress_price_per_gb=0.02)
    change = decide(job, launched, at(131))
    assert change is not None and change.job.attempts[1].egress_price_per_gb == 0.02


@pytest.mark.parametrize(
    ("lang", "card_words", "costs_words"),
    [("en", "egress $0.5000", "(egress $0.50)"), ("zh-CN", "跨区域传输 $0.5000", "（跨区域传输 $0.50）")],
)
def test_the_card_and_costs_say_the_egress_only_when_there_is_some(
    lang: Lang, card_words: str, costs_words: str
) -> None:
    plain = worked_example()
    second = plain.attempts[1].model_copy(update={"moved_bytes": 25 * GB, "egress_price_per_gb": 0.02})
    moved = plain.model_copy(update={"attempts": [plain.attempts[0], second]})
    assert card_words in card_text(moved, at(300), lang)
    assert card_words not in card_text(plain, at(300), lang)
    end = at(300) + timedelta(hours=1)
    report = cost_report([moved.model_copy(update={"created_at": at(0), "updated_at": at(226)})], "7d", end)
    assert report_json(report)["total"]["egress"] == 0.5
    assert costs_words in costs_text(report, lang)
    without = cost_report([plain.model_copy(update={"created_at": at(0), "updated_at": at(226)})], "7d", end)
    assert costs_words not in costs_text(without, lang)
