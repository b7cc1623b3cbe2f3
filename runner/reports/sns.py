"""``sns:<topic arn>``: publish to SNS, the AWS path (SNS → SQS → bot), signed as the HTTP path signs.

The signature and its timestamp travel as message attributes (``finetune_signature``, ``finetune_timestamp``),
over exactly the published message, with the attempt's report key (:mod:`handlers.signing`): IAM lets every
runner publish to the report topic, so the bot believes a report only with the key of the attempt it names.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aiobotocore.session import get_session
from botocore.config import Config

from handlers.reports import REPORT_ATTRIBUTE, SIGNATURE_ATTRIBUTE, TIMESTAMP_ATTRIBUTE
from handlers.signing import sign
from runner.reports.key import KEY_VARIABLE, report_key


class SnsTarget:
    def __init__(self, target: str, secret: str | None = None) -> None:
        self.name = target
        self.topic_arn = target.removeprefix("sns:")
        self.region = self.topic_arn.split(":")[3]
        self.secret = secret if secret is not None else report_key()
        if not self.secret:
            raise ValueError(f"report target {target} needs the attempt's report key ({KEY_VARIABLE}) to sign reports")
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def deliver(self, line: str, report_type: str) -> None:
        if self._client is None:
            config = Config(retries={"max_attempts": 3, "mode": "standard"})
            self._client = await self._stack.enter_async_context(
                get_session().create_client("sns", region_name=self.region, config=config)
            )
        now = int(time.time())
        await self._client.publish(
            TopicArn=self.topic_arn,
            Message=line,
            MessageAttributes={
                # Lets SQS subscriptions filter on the report type without parsing the body.
                REPORT_ATTRIBUTE: {"DataType": "String", "StringValue": report_type},
                TIMESTAMP_ATTRIBUTE: {"DataType": "String", "StringValue": str(now)},
                SIGNATURE_ATTRIBUTE: {"DataType": "String", "StringValue": sign(self.secret, now, line.encode())},
            },
        )

    async def close(self) -> None:
        await self._stack.aclose()
