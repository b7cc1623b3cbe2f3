"""The Slack adapter: ``/finetune``, Block Kit job cards, thread replies, alerts, pages and their buttons.

Nothing is imported here, so reading the config model (``config``) does not load slack_bolt.
"""
