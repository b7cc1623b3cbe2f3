"""What the settings alone say: is some event source set for the cloud (else no spot warning ever reaches the
bot), and is some chat adapter set (else its notes go to its log only)."""

from __future__ import annotations

from bot.checks.result import Check, failed, passed
from bot.settings import Settings

AWS_SOURCE_FIX = (
    "set FINETUNE_SQS_QUEUE_URL to the runner stacks' EventsQueueUrl, one per region, comma-separated (or "
    "FINETUNE_SNS_TOPICS for the HTTPS endpoint POST /aws/sns)"
)
ALIYUN_SOURCE_FIX = (
    "set FINETUNE_ALIYUN_WEBHOOK_TOKEN and point CloudMonitor or EventBridge at https://<bot>/aliyun/cloudmonitor "
    "(deploy/aliyun/finetune.ros.yaml)"
)
CHAT_FIX = (
    "set SLACK_BOT_TOKEN with SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (HTTP mode), or "
    "DINGTALK_CLIENT_ID and DINGTALK_CLIENT_SECRET"
)


def event_source(settings: Settings) -> Check:
    """``blocks_start`` on a cloud without one: a bot that never hears of an interruption cannot recover from it."""
    name = "event source"
    if settings.finetune_cloud == "local":
        return passed(name, "the local cloud's instances tell the bot themselves")
    if settings.finetune_cloud == "aws":
        routes = []
        queues = settings.finetune_sqs_queue_url
        if queues:
            routes.append(f"SQS queue{'s' if len(queues) > 1 else ''} {', '.join(queues)}")
        if settings.sns_topics:
            routes.append(f"SNS over HTTPS from {len(settings.sns_topics)} topic(s)")
        if routes:
            return passed(name, ", ".join(routes))
        missing = "none: FINETUNE_SQS_QUEUE_URL and FINETUNE_SNS_TOPICS are unset, so no spot warning reaches the bot"
        return failed(name, missing, AWS_SOURCE_FIX, blocks_start=True)
    if settings.finetune_aliyun_webhook_token:
        return passed(name, "the CloudMonitor / EventBridge webhook routes")
    missing = "none: FINETUNE_ALIYUN_WEBHOOK_TOKEN is unset, so no preemption notice reaches the bot"
    return failed(name, missing, ALIYUN_SOURCE_FIX, blocks_start=True)


def chat_adapter(settings: Settings) -> Check:
    name = "chat"
    adapters = []
    if settings.secret("slack_bot_token"):
        adapters.append("Slack (Socket Mode)" if settings.secret("slack_app_token") else "Slack (HTTP mode)")
    if settings.dingtalk_client_id:
        adapters.append("DingTalk")
    if adapters:
        return passed(name, " and ".join(adapters))
    if settings.finetune_cloud == "local":
        return passed(name, "none set: the console only (finetune-bot chat)")
    return failed(name, "none set: the bot's notes and alerts go to its log only", CHAT_FIX)
