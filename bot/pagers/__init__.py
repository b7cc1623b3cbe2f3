"""Paging tools (PagerDuty, Opsgenie): the calls the chat outbox makes for a page (:mod:`bot.pagers.calls`), and
the webhooks through which an acknowledgement made in a tool reaches the job (:mod:`bot.pagers.webhooks`)."""
