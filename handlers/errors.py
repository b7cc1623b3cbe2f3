"""The pure core's one error for input from outside that it does not understand (a cloud's event, an SQS or SNS
message, a runner's report): every parser in ``handlers/`` raises it, every source in ``bot/sources/`` catches it."""

from __future__ import annotations


class UnrecognisedMessage(ValueError):
    """Not something this bot understands; ``reason`` says why, for the log, the HTTP answer and whoever reads the
    dead letters."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
