"""The SQS consumer: EventBridge targets and SNS subscriptions in, bus messages out. The bot runs one per queue in
``FINETUNE_SQS_QUEUE_URL`` (one queue per region), each with a client of its queue's region
(:mod:`bot.cloud.aws.queue_url`), all publishing to the one bus, whose deterministic ids deduplicate across them.

Delivery rules (at least once; nothing lost; poison kept as evidence):

- A message is deleted only after every bus message parsed from it was published. A crash in between means a
  redelivery, which the bus messages' deterministic ids make harmless.
- A message that fails — publishing raised, or :func:`handlers.aws_events.parse_aws_message` does not recognise
  it — is left alone: it becomes visible again after the queue's visibility timeout (which is the retry backoff),
  and once it has been received ``maxReceiveCount`` times the queue's redrive policy moves it to the dead-letter
  queue. Unrecognised messages are deliberately *not* deleted at once: the dead-letter queue keeps the evidence
  (what sent it, what it looked like) for whoever fixes the rule or the parser, and they can be redriven after
  the fix. The consumer warns at start if the queue has no redrive policy, since then such a message returns
  until the retention period ends.
- A message that is understood and needs nothing (an instance became ``running``) is deleted at once.
- SQS errors never end the loop: it logs, backs off exponentially (capped), and keeps going.
- SNS envelopes arriving here are not signature-checked: IAM authenticates whoever sends to the queue and the
  queue policy decides who may (the HTTPS endpoint, open to anyone, is where signatures are verified). What each
  topic may carry is checked, and every runner report's own signature (:mod:`bot.sources.aws_intake`, the bot's
  ``parse``), judged against when the queue received the report (the envelope's ``Timestamp``, else the
  message's ``SentTimestamp``, which every receive asks for), not against when it is read: a report that waited
  in the queue while every bot was down is as good as new (:mod:`handlers.report_freshness`).
- A message refused there (a report unsigned, signed with another attempt's key, signed long before it was
  queued, or on the events topic; a cloud event on the report topic) is never published and never deleted
  unseen: it is sent to the dead-letter queue with the reason as its ``reason`` message attribute (its body and
  attributes unchanged), and only then deleted here (``dead_lettered``). Sent explicitly, not left for the
  redrive policy, because a refusal is a verdict on the message itself: another receive cannot change it, and
  waiting ``maxReceiveCount`` visibility timeouts would only refuse it again, each time, and lose the reason.
  The dead-letter queue is the one the queue's redrive policy names (read at start). Without one, or when the
  send fails, the message stays in the queue: it comes back, and SQS's redrive moves it when there is a policy.
- On ``stop``, a batch in hand is finished (published and deleted) and the long poll in flight is abandoned. A
  message SQS handed out in that very instant returns after the visibility timeout, one receive count older.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from bot.cloud.aws.region import aws_session
from bot.errors import InputRefused, StoreUnavailable
from bot.log_limit import LimitedLog
from bot.sources.aws_intake import parse_plain
from handlers.backoff import backoff
from handlers.errors import UnrecognisedMessage
from handlers.messages import BusMessage

log = logging.getLogger(__name__)

MAX_WAIT_SECONDS = 20  # the longest long poll SQS allows
MAX_MESSAGES = 10  # the largest batch SQS returns

REASON_ATTRIBUTE = "reason"  # a refused message's reason, on its copy in the dead-letter queue
MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message
MAX_REASON_CHARS = 1000

Publish = Callable[[BusMessage], Awaitable[str]]  # the bus encodes the message once, from the model
# (body, string attributes, when SQS received it in seconds) -> bus messages
Parse = Callable[[str, Mapping[str, str], float | None], Awaitable[Sequence[BusMessage]]]
ClientFactory = Callable[[], AbstractAsyncContextManager[Any]]


@dataclass
class SqsStats:
    """What the source did, counted (tests wait on these)."""

    received: int = 0
    published: int = 0
    deleted: int = 0
    ignored: int = 0  # understood, nothing to do: deleted
    unrecognised: int = 0  # left for the dead-letter queue
    refused: int = 0  # not believed (a report without its attempt's signature, a message on the wrong topic)
    dead_lettered: int = 0  # refused, sent to the dead-letter queue with the reason, then deleted here
    publish_failures: int = 0  # left for redelivery
    errors: int = 0


class SqsSource:
    """Long-polls one queue and publishes what it receives; see the module docstring for the rules."""

    def __init__(
        self,
        queue_url: str,
        publish: Publish,
        *,
        region: str | None = None,
        client_factory: ClientFactory | None = None,
        wait_seconds: int = MAX_WAIT_SECONDS,
        max_messages: int = MAX_MESSAGES,
        max_backoff: float = 30.0,
        parse: Parse = parse_plain,
    ) -> None:
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be within 0..{MAX_WAIT_SECONDS}")
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise ValueError(f"max_messages must be within 1..{MAX_MESSAGES}")
        self.queue_url = queue_url
        self._publish = publish
        # The region as every AWS client of the bot takes it (aws.region, AWS_REGION, AWS_DEFAULT_REGION, profile).
        self._client_factory = client_factory or (lambda: aws_session(region).client("sqs"))
        self.wait_seconds = wait_seconds
        self.max_messages = max_messages
        self.max_backoff = max_backoff
        self._parse = parse
        self.stats = SqsStats()
        self.redrive_policy: str | None = None
        self.dead_letter_url: str | None = None  # from the redrive policy, at start
        self._quiet = LimitedLog(log)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; returns once the batch in hand is done."""
        async with self._client_factory() as client:
            await self._check_redrive(client)
            failures = 0
            while not stop.is_set():
                try:
                    messages = await self._receive(client, stop)
                except Exception as exc:
                    failures += 1
                    self.stats.errors += 1
                    delay = backoff(failures, base=0.5, cap=self.max_backoff, jitter=0)
                    log.warning("cannot receive from %s (%s): retrying in %.1fs", self.queue_url, exc, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    continue
                failures = 0
                for message in messages:
                    await self._handle(client, message)

    async def _receive(self, client: Any, stop: asyncio.Event) -> list[dict[str, Any]]:
        """One long poll, abandoned if ``stop`` is set first (then nothing is returned)."""
        receive = asyncio.ensure_future(
            client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=self.max_messages,
                WaitTimeSeconds=self.wait_seconds,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
            )
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({receive, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not receive.done():
                receive.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await receive
        if receive.cancelled():
            return []
        messages: list[dict[str, Any]] = receive.result().get("Messages", [])
        self.stats.received += len(messages)
        return messages

    async def _handle(self, client: Any, message: Mapping[str, Any]) -> None:
        message_id = message.get("MessageId")
        receives = message.get("Attributes", {}).get("ApproximateReceiveCount", "?")
        try:
            bus_messages = await self._parse(message.get("Body", ""), _string_attributes(message), _sent_at(message))
        except InputRefused as refused:  # counted and logged where refused
            self.stats.refused += 1
            await self._dead_letter(client, message, refused.reason)
            return
        except UnrecognisedMessage as exc:
            self.stats.unrecognised += 1
            log.warning(
                "unrecognised SQS message %s (receive %s): %s; left for the dead-letter queue",
                message_id,
                receives,
                exc.reason,
            )
            return
        except StoreUnavailable as exc:  # a report's key salt could not be read: SQS delivers it again later
            self.stats.publish_failures += 1
            log.warning("SQS message %s (receive %s) not checked: Redis is unavailable (%s)", message_id, receives, exc)
            return
        except Exception:
            self.stats.unrecognised += 1
            log.exception(
                "parsing SQS message %s (receive %s) failed; left for the dead-letter queue", message_id, receives
            )
            return
        for bus_message in bus_messages:
            try:
                await self._publish(bus_message)
            except StoreUnavailable as exc:  # an outage, not a bug: one line, and SQS keeps the message
                self.stats.publish_failures += 1
                log.warning(
                    "could not publish SQS message %s (receive %s): Redis is unavailable (%s); it will be redelivered",
                    message_id,
                    receives,
                    exc,
                )
                return
            except Exception:
                self.stats.publish_failures += 1
                log.exception(
                    "could not publish SQS message %s (receive %s); it will be redelivered", message_id, receives
                )
                return
            self.stats.published += 1
        if not bus_messages:
            self.stats.ignored += 1
        await self._delete(client, message)

    async def _delete(self, client: Any, message: Mapping[str, Any]) -> None:
        try:
            await client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        except Exception as exc:
            self.stats.errors += 1
            log.warning(
                "could not delete SQS message %s (%s): its redelivery will be handled the same way",
                message.get("MessageId"),
                exc,
            )
            return
        self.stats.deleted += 1

    async def _dead_letter(self, client: Any, message: Mapping[str, Any], reason: str) -> None:
        """Send a refused message to the dead-letter queue with ``reason``, then delete it here; on any failure
        leave it (it comes back, and is refused again)."""
        message_id = message.get("MessageId")
        if self.dead_letter_url is None:  # it comes back each visibility timeout: said at a bounded rate
            self._quiet.warning(
                "refused-kept", "refused SQS message %s stays in %s: no dead-letter queue", message_id, self.queue_url
            )
            return
        attributes = _forwarded_attributes(message)
        attributes[REASON_ATTRIBUTE] = {"DataType": "String", "StringValue": _attribute_text(reason)}
        try:
            await client.send_message(
                QueueUrl=self.dead_letter_url, MessageBody=message.get("Body", ""), MessageAttributes=attributes
            )
        except Exception as exc:
            self.stats.errors += 1
            log.warning(
                "could not move refused SQS message %s to %s (%s): it stays, and comes back",
                message_id,
                self.dead_letter_url,
                exc,
            )
            return
        self.stats.dead_lettered += 1
        await self._delete(client, message)

    async def _check_redrive(self, client: Any) -> None:
        try:
            reply = await client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["RedrivePolicy"])
        except Exception as exc:
            log.warning("cannot read the attributes of %s (%s); consuming anyway", self.queue_url, exc)
            return
        self.redrive_policy = reply.get("Attributes", {}).get("RedrivePolicy")
        if not self.redrive_policy:
            log.warning(
                "%s has no redrive policy: a message the bot cannot handle or refuses will come back until the "
                "retention period ends instead of moving to a dead-letter queue",
                self.queue_url,
            )
            return
        await self._find_dead_letter_queue(client, self.redrive_policy)

    async def _find_dead_letter_queue(self, client: Any, redrive_policy: str) -> None:
        """The URL of the queue ``redrive_policy`` names (same region; its ARN ends in ``<account>:<name>``)."""
        try:
            arn = str(json.loads(redrive_policy)["deadLetterTargetArn"])
            account, name = arn.split(":")[4:6]
            reply = await client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)
        except Exception as exc:
            log.warning(
                "cannot find the dead-letter queue of %s (%s): a refused message stays until the redrive policy "
                "moves it, without its reason",
                self.queue_url,
                exc,
            )
            return
        self.dead_letter_url = str(reply["QueueUrl"])


def _sent_at(message: Mapping[str, Any]) -> float | None:
    """When SQS received ``message`` (its ``SentTimestamp``, milliseconds), in seconds; None if it does not say."""
    sent = message.get("Attributes", {}).get("SentTimestamp")
    return int(sent) / 1000 if isinstance(sent, str) and sent.isdigit() else None


def _forwarded_attributes(message: Mapping[str, Any]) -> dict[str, dict[str, str | bytes]]:
    """The message's own attributes as SendMessage takes them (raw SNS delivery carries a report's signature
    there), leaving room for the reason."""
    attributes: Mapping[str, Any] = message.get("MessageAttributes", {})
    forwarded: dict[str, dict[str, str | bytes]] = {}
    for name in sorted(attributes):
        if name == REASON_ATTRIBUTE:
            continue
        if len(forwarded) == MAX_ATTRIBUTES - 1:
            break
        value = attributes[name]
        for field in ("StringValue", "BinaryValue"):
            if field in value:
                forwarded[name] = {"DataType": value["DataType"], field: value[field]}
                break
    return forwarded


def _attribute_text(text: str) -> str:
    """``text`` as an SQS attribute value may hold it: bounded, and only the characters SQS allows."""
    allowed = (
        char if char in "\t\n\r" or " " <= char <= "\ud7ff" or "\ue000" <= char <= "\ufffd" or char > "\uffff" else "?"
        for char in text[:MAX_REASON_CHARS]
    )
    return "".join(allowed)


def _string_attributes(message: Mapping[str, Any]) -> dict[str, str]:
    """The message's string (and number) attributes; raw SNS delivery puts the SNS message attributes here."""
    attributes: Mapping[str, Any] = message.get("MessageAttributes", {})
    return {name: value["StringValue"] for name, value in attributes.items() if "StringValue" in value}
