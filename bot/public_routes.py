"""The routes the outside posts to, which a deployment's public HTTPS front (load balancer, Ingress) forwards.

One list, so that a route added to the bot is public only once it is classified here and every template that
fronts it routes it: tests/test_public_routes.py holds the bot's router and each template in deploy/ to it. The
other routes (``INTERNAL_ROUTES``) stay inside the network. Grouped by who posts, since a template routes only
the groups its deployment can use (the Alibaba stack has no Slack, the AWS one no Alibaba pushes).
"""

from __future__ import annotations

from typing import Final

from bot.chat.slack.app import EVENTS_PATH
from bot.costs import COSTS_PATH
from bot.http import REPORTS_PATH
from bot.pagers.webhooks import OPSGENIE_PATH, PAGERDUTY_PATH
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH
from bot.sources.sns_http import SNS_PATH

PUBLIC_ROUTES: Final[dict[str, frozenset[str]]] = {
    "slack": frozenset({EVENTS_PATH}),  # HTTP mode (Socket Mode needs none)
    "runner": frozenset({REPORTS_PATH}),
    "pagers": frozenset({PAGERDUTY_PATH, OPSGENIE_PATH}),
    "aws": frozenset({SNS_PATH}),
    "aliyun": frozenset({CLOUDMONITOR_PATH, EVENTBRIDGE_PATH}),
}
# Probes, the Prometheus scrape and the cost report (a bearer token for dashboards inside the network).
INTERNAL_ROUTES: Final[frozenset[str]] = frozenset({"/healthz", "/metrics", COSTS_PATH})
