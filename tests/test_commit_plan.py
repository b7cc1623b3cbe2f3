"""The commit plan against a deadline, as a pure function: what is kept, what is dropped, whether to ask."""

from __future__ import annotations

from runner.commit_plan import Candidate, MiB, Situation, fits, plan

RATE = 10 * MiB  # bytes/s


def complete(step: int, mib: float, uploaded_mib: float = 0.0, in_flight: bool = True) -> Candidate:
    return Candidate(step, True, int(mib * MiB), int(uploaded_mib * MiB), in_flight)


def writing(step: int, mib: float, uploaded_mib: float = 0.0) -> Candidate:
    return Candidate(step, False, int(mib * MiB), int(uploaded_mib * MiB), True)


def situation(
    left: float,
    *candidates: Candidate,
    rate: float | None = RATE,
    save_seconds: float | None = None,
    step_seconds: float | None = None,
    checkpoint_bytes: int | None = None,
    watches_stop_file: bool = False,
) -> Situation:
    return Situation(left, candidates, rate, save_seconds, step_seconds, checkpoint_bytes, watches_stop_file)


def test_an_upload_in_flight_is_kept_and_no_save_asked_that_cannot_follow_it() -> None:
    # The first finding: checkpoint-10 has ~11 s of upload left and 17.6 s to go. Keep it; a fresh 640 MiB save
    # behind it (another 64 s) cannot make it, so the trainer is not asked.
    decided = plan(situation(15.6, complete(10, 640, uploaded_mib=530), checkpoint_bytes=640 * MiB))
    assert decided.keep == (10,) and decided.drop == ()
    assert decided.fresh == "halt" and "needs ~75s" in decided.why


def test_a_fresh_save_is_asked_for_when_it_fits_behind_what_is_finishing() -> None:
    decided = plan(situation(60, complete(10, 100, uploaded_mib=50), save_seconds=3, step_seconds=1))
    assert decided.keep == (10,)
    assert decided.fresh == "ask"  # (50 + 100) MiB at 10 MiB/s = 15 s, with margin 20.75 s < 60 s


def test_the_save_time_counts_when_it_is_the_longer_part() -> None:
    small = complete(10, 10)
    assert plan(situation(30, small, save_seconds=20)).fresh == "ask"  # 20 * 1.25 + 2 = 27 <= 30
    assert plan(situation(30, small, save_seconds=23)).fresh == "halt"


def test_older_uploads_in_flight_are_never_abandoned_for_a_newer_one_and_unstarted_ones_are() -> None:
    decided = plan(
        situation(
            100,
            complete(30, 100, in_flight=False),
            complete(10, 100, uploaded_mib=90),
            complete(20, 100, in_flight=False),
        )
    )
    assert decided.keep == (10, 30)  # the nearly done one first on the wire, then the newest
    assert decided.drop == ((20, "superseded by checkpoint-30"),)


def test_a_trainer_that_watches_the_stop_file_is_asked_during_a_save_in_flight_since_it_stops_after_it() -> None:
    decided = plan(situation(60, complete(10, 50), writing(20, 20), watches_stop_file=True))
    assert decided.keep == (10, 20) and decided.fresh == "ask" and decided.saving == 20
    assert decided.why == "the trainer is saving checkpoint-20 and stops right after it"


def test_a_sigterm_trainer_saving_is_asked_only_if_the_save_after_it_fits_and_held_otherwise() -> None:
    # It finishes checkpoint-20 (half written), trains a step, then saves again: 64 MiB more behind 64 + 64.
    roomy = plan(situation(60, writing(20, 32), save_seconds=4, step_seconds=1, checkpoint_bytes=64 * MiB))
    assert roomy.fresh == "ask" and roomy.saving == 20  # max(2 + 1 + 4, 128 MiB / 10 MiB/s) * 1.25 + 2 = 18 s
    tight = plan(situation(15, writing(20, 32), save_seconds=4, step_seconds=1, checkpoint_bytes=64 * MiB))
    assert tight.keep == (20,) and tight.fresh == "halt" and tight.because == "too-slow" and tight.saving == 20
    assert "after checkpoint-20" in tight.why


def test_a_save_in_flight_without_a_rate_or_a_size_waits_for_the_measurement() -> None:
    assert plan(situation(60, writing(20, 10), rate=None)).fresh == "wait"


def test_without_a_rate_or_an_upload_to_measure_it_a_save_that_fits_at_the_assumed_rate_is_asked_for() -> None:
    # The third finding: a 10 s notice, checkpoint-10 complete, nothing measured yet: a small save fits even at an
    # assumed 25 MiB/s, so the SIGTERM-saving trainer is asked (and checkpoint-10 still goes up first).
    # Nothing going up could measure the link (checkpoint-10's upload not started yet, say: a retry's back-off).
    decided = plan(situation(10, complete(10, 5, in_flight=False), rate=None, step_seconds=0.5))
    assert decided.keep == (10,) and decided.fresh == "ask" and "assumed 25.0 MiB/s" in decided.why
    # 1 GiB each at 25 MiB/s is ~82 s: not asked.
    big = plan(situation(60, complete(10, 1024, in_flight=False), rate=None))
    assert big.fresh == "wait" and big.because == "no-rate" and "no upload rate measured yet" in big.why
    # An upload in flight measures the link within a part or two: its measurement decides, not a guess.
    measuring = plan(situation(10, complete(10, 5), rate=None, step_seconds=0.5))
    assert measuring.fresh == "wait" and measuring.why == "no upload rate measured yet"


def test_a_checkpoint_being_written_that_cannot_go_up_in_time_is_dropped() -> None:
    decided = plan(situation(8, complete(10, 50), writing(20, 10), checkpoint_bytes=50 * MiB))
    assert decided.keep == (10,)  # 50 MiB ahead + 50 expected at 10 MiB/s = 10 s > 8 s
    assert decided.drop[0][0] == 20 and "cannot finish" in decided.drop[0][1]
    assert decided.fresh == "halt"


def test_without_a_rate_the_decision_waits_if_something_is_in_flight_and_asks_if_nothing_is() -> None:
    assert plan(situation(60, complete(10, 50), rate=None)).fresh == "wait"
    nothing = plan(situation(60, rate=None))
    assert nothing.keep == () and nothing.fresh == "ask"
    assert plan(situation(60, rate=RATE)).fresh == "ask"  # nothing to judge the size by either


def test_with_nothing_to_protect_a_save_that_cannot_go_up_in_time_is_not_asked_for() -> None:
    # The second finding: a 1 GB save with 8 s left starts an upload that cannot finish.
    decided = plan(situation(6, rate=70 * MiB, checkpoint_bytes=1024 * MiB))
    assert decided.fresh == "halt" and "6s left" in decided.why


def test_margins() -> None:
    assert fits(8, 12) and not fits(8.1, 12)
