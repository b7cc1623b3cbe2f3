"""Event sources: where cloud events and runner reports come from before they reach the bus.

``sqs`` consumes an SQS queue (EventBridge targets, SNS subscriptions); ``sns_http`` is the SNS HTTPS endpoint,
with ``sns_signature`` verifying what SNS signed. Each only converts and publishes; ``handlers.aws_events`` parses.
"""
