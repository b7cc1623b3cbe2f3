"""``sns:<topic arn>``: publish to SNS, the AWS path (SNS → SQS → bot)."""

from __future__ import annotations

import contextlib
from typing import Any

from aiobotocore.session import get_session
from botocore.config import Config


class SnsTarget:
    def __init__(self, target: str) -> None:
        self.name = target
        self.topic_arn = target.removeprefix("sns:")
        self.region = self.topic_arn.split(":")[3]
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def deliver(self, line: str, report_type: str) -> None:
        if self._client is None:
            config = Config(retries={"max_attempts": 3, "mode": "standard"})
            self._client = await self._stack.enter_async_context(
                get_session().create_client("sns", region_name=self.region, config=config)
            )
        await self._client.publish(
            TopicArn=self.topic_arn,
            Message=line,
            # Lets SQS subscriptions filter on the report type without parsing the body.
            MessageAttributes={"finetune_report": {"DataType": "String", "StringValue": report_type}},
        )

    async def close(self) -> None:
        await self._stack.aclose()
