"""Who may say what on the AWS routes (SQS and the SNS HTTPS endpoint): cloud events and runner reports apart.

EventBridge publishes to the events topic, runners to the report topic (``deploy/aws/finetune.yaml``); a message in
an SNS envelope is taken only for what its topic carries:

- a runner report only from a report topic, and only signed with the key of the attempt it names (the signature
  and its timestamp are message attributes; :class:`bot.report_gate.ReportGate`), when SNS (the envelope's
  ``Timestamp``) or SQS (the message's sent time) received it, however long it waited since;
- a cloud event only from an events topic (when none is configured: from any topic but a report topic), never
  from a report topic, which every runner may publish to.

A message without an envelope (an EventBridge rule targeting the queue directly, or raw delivery) has no topic to
check: the queue's policy decides who may send it, and a report still needs its signature. Refusals raise
:class:`~bot.errors.InputRefused` and are counted: the SQS consumer moves such a message to the dead-letter
queue with the reason, the HTTPS endpoint answers 403; neither publishes anything.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from bot.errors import InputRefused
from bot.log_limit import LimitedLog
from bot.report_gate import ReportGate
from handlers.aws_events import parse_aws_message, parse_delivery, unwrap
from handlers.messages import BusMessage
from handlers.reports import SIGNATURE_ATTRIBUTE, TIMESTAMP_ATTRIBUTE

log = logging.getLogger(__name__)
EVENTS_REFUSED_METRIC = "finetune_cloud_events_refused_total"


class AwsIntake:
    def __init__(
        self,
        reports: ReportGate,
        *,
        report_topics: Collection[str],
        events_topics: Collection[str] = (),
        route: str = "sqs",
        events_refused: Counter[str] | None = None,
    ) -> None:
        self.reports = reports
        self.report_topics = frozenset(report_topics)
        self.events_topics = frozenset(events_topics)
        self.route = route
        self.events_refused: Counter[str] = Counter() if events_refused is None else events_refused  # by route
        self._quiet = LimitedLog(log)

    def for_route(self, route: str) -> AwsIntake:
        """The same rules, counted under another route's name (``sns`` for the HTTPS endpoint)."""
        return AwsIntake(
            self.reports,
            report_topics=self.report_topics,
            events_topics=self.events_topics,
            route=route,
            events_refused=self.events_refused,
        )

    def metrics(self) -> dict[str, float]:
        """Cloud events refused for their topic, every route together (refused reports: the gate's metrics)."""
        return {EVENTS_REFUSED_METRIC: float(sum(self.events_refused.values()))}

    async def parse(
        self, body: str | bytes, attributes: Mapping[str, str] | None = None, sent_at: float | None = None
    ) -> Sequence[BusMessage]:
        """The bus messages of one delivery; InputRefused (counted) or UnrecognisedMessage (not counted).
        ``sent_at``: when SQS received it (a report's freshness is judged by when its queue took it)."""
        delivery = unwrap(body, attributes, sent_at)
        topic = delivery.topic
        if delivery.is_report:
            if topic is not None and topic not in self.report_topics:
                raise self.reports.refuse(
                    f"refused a runner report ({self.route}) on {topic}, which is not a report topic", route=self.route
                )
            signed = delivery.attributes
            message = await self.reports.admit(
                delivery.message.encode(),
                signed.get(TIMESTAMP_ATTRIBUTE),
                signed.get(SIGNATURE_ATTRIBUTE),
                route=self.route,
                queued_at=delivery.queued_at,
            )
            return [message]
        if topic is not None and not self._carries_events(topic):
            self.events_refused[self.route] += 1
            reason = f"refused a cloud event ({self.route}) on {topic}, which is not an events topic"
            self._quiet.warning(f"event-refused:{self.route}", "%s", reason)
            raise InputRefused(reason, status=401)
        return parse_delivery(delivery)

    def _carries_events(self, topic: str) -> bool:
        if self.events_topics:
            return topic in self.events_topics
        return topic not in self.report_topics


async def parse_plain(
    body: str | bytes, attributes: Mapping[str, str] | None = None, sent_at: float | None = None
) -> Sequence[BusMessage]:
    """:func:`handlers.aws_events.parse_aws_message` with the intake's signature (the sources' default, for tests
    that need no report gate)."""
    return parse_aws_message(body, attributes, sent_at)


__all__ = ["AwsIntake", "parse_plain"]
