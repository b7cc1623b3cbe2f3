"""The one door every runner report comes through, whatever the route (HTTP, SNS over HTTPS, SQS).

A report is believed only when it is signed with the key of the (job, attempt) it names (:mod:`handlers.report_keys`:
derived from the salt stored with that attempt, looked up here), within the tolerance window of when it reached the
bot's side (a queue's receive time on SNS and SQS, the bot's clock on HTTP: :mod:`handlers.report_freshness`), its
fields are within their caps (:func:`handlers.reports.parse_report`), and every URI it names lies under its job's
prefix (:mod:`handlers.report_scope`).
Anything else is refused, counted (``finetune_reports_refused_total`` on ``/metrics``), logged at a bounded rate,
and changes nothing. An accepted report becomes its bus message, under the reports' own id namespace.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from pydantic import ValidationError

from bot.errors import InputRefused
from bot.log_limit import LimitedLog
from handlers.clock import utcnow
from handlers.messages import ReportReceived, report_received
from handlers.report_keys import claimed_sender, verify_report
from handlers.report_scope import outside_prefix
from handlers.reports import parse_report

log = logging.getLogger(__name__)

REFUSED_METRIC = "finetune_reports_refused_total"
# (job id, attempt) -> the key salt stored with that attempt, None when the store holds no such attempt
# (bot.store.JobStore.key_salt); StoreUnavailable when the store cannot say (the route answers 503, the runner retries).
SaltLookup = Callable[[str, int], Awaitable[str | None]]


class ReportGate:
    def __init__(
        self,
        master: str,
        salts: SaltLookup,
        prefix_of: Callable[[str], str],
        clock: Callable[[], float] = time.time,
        stamp: Callable[[], datetime] = utcnow,
    ) -> None:
        """``prefix_of``: a job's storage prefix (the cloud's ``checkpoint_uri``); ``stamp``: the bot's clock, which
        dates the admission of a report (its bus message's ``at``: what an ended attempt's grace is judged by,
        handlers/report_fence.py)."""
        if not master:
            raise ValueError("the report gate needs the master report secret")
        self._master = master
        self._salts = salts
        self._prefix_of = prefix_of
        self._stamp = stamp
        self.clock = clock
        self.refused: Counter[str] = Counter()  # by route
        self._quiet = LimitedLog(log)

    async def admit(
        self,
        body: bytes,
        timestamp: str | None,
        signature: str | None,
        *,
        route: str,
        queued_at: float | None = None,
    ) -> ReportReceived:
        """The bus message of a report that passes; :class:`~bot.errors.InputRefused` (counted) for any other:
        401 for a signature problem, 400 for a signed report that is malformed or beyond a cap (``detail``: the
        validation errors, for the sender). ``queued_at``:
        when a queue received it (its freshness is judged against that, :mod:`handlers.report_freshness`, and so is
        an ended attempt's grace)."""
        sender = claimed_sender(body)
        if not timestamp or not signature:
            why: str | None = "unsigned"
        elif sender is None:
            why = "names no job and attempt"
        else:  # looked up only for a report that names an attempt and carries a signature
            salt = await self._salts(sender.job_id, sender.attempt)
            if salt is None:
                why = f"{sender.job_id} has no attempt {sender.attempt}"
            else:
                why = verify_report(self._master, sender, salt, body, timestamp, signature, self.clock(), queued_at)
        if why is not None:
            raise self.refuse(f"refused a runner report ({route}): {why}", route=route, signed=False)
        try:
            report = parse_report(body)
        except ValidationError as exc:
            detail: list[dict[str, object]] = [
                {"loc": list(error["loc"]), "msg": error["msg"]} for error in exc.errors()[:5]
            ]
            raise self.refuse(
                f"refused a malformed runner report ({route}): {detail[0]}", route=route, signed=True, detail=detail
            ) from None
        outside = outside_prefix(report, self._prefix_of(report.job_id))
        if outside is not None:
            detail = [{"loc": ["uri"], "msg": "outside the job's prefix"}]
            raise self.refuse(f"refused a runner report ({route}): {outside}", route=route, signed=True, detail=detail)
        admitted = datetime.fromtimestamp(queued_at, UTC) if queued_at is not None else self._stamp()
        return report_received(report).model_copy(update={"at": admitted})

    def refuse(
        self, reason: str, *, route: str, signed: bool = False, detail: list[dict[str, object]] | None = None
    ) -> InputRefused:
        """Count and log a refusal (also one decided elsewhere: a report on the wrong topic); returns the error:
        ``signed`` (by its attempt, but not a report the bot takes) answers 400, anything else 401."""
        self.refused[route] += 1
        self._quiet.warning(f"report-refused:{route}", "%s", reason)
        return InputRefused(reason, status=400 if signed else 401, detail=detail)

    def metrics(self) -> dict[str, float]:
        return {REFUSED_METRIC: float(sum(self.refused.values()))}
