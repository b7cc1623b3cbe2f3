"""DingTalk: ``@bot /finetune …`` in a group over the Stream mode, job cards as interactive cards with buttons,
alerts and on-call pages through a group's custom robot webhook, in Chinese unless a channel asks for English.

Modules: ``config`` (the ``dingtalk:`` section), ``stream`` (the connection), ``inbound`` (messages and button
clicks in, as bot commands), ``deliverer`` (notifications out), ``chat`` (the ChatPort until the durable chat
outbox takes over), ``adapter`` (wiring for the service); the rest are the pieces they share.
"""
