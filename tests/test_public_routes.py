"""Every public webhook route the bot serves is routed by every template that fronts it, over HTTPS only.

bot/public_routes.py is the one list. The bot's router, built here with every route it can serve switched on,
serves exactly that list plus the internal routes, so a route added to the bot fails this file until it is
classified; each template (the AWS load balancer, the Alibaba load balancer, the Kubernetes Ingress) then
forwards exactly the public groups its deployment can use, on an HTTPS listener, and nothing else.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import yaml

from bot.chat.slack.app import events_route
from bot.costs import costs_routes
from bot.http import build_app
from bot.pagers.webhooks import pager_routes
from bot.public_routes import INTERNAL_ROUTES, PUBLIC_ROUTES
from bot.sources.aliyun_http import aliyun_routes
from bot.sources.sns_http import sns_routes
from bot.sources.sns_signature import SnsVerifier
from tests.test_images import _CfnLoader

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
# Which groups of PUBLIC_ROUTES each template's deployment serves: the Alibaba stack has DingTalk (Stream mode, no
# inbound URL) and no Slack secret; the AWS stack no Alibaba pushes; the Kubernetes example runs on either cloud.
TEMPLATE_GROUPS = {
    "aws/bot.yaml": {"slack", "runner", "pagers", "aws"},
    "aliyun/bot.ros.yaml": {"runner", "pagers", "aliyun"},
    "kubernetes/finetune-bot.yaml": set(PUBLIC_ROUTES),
}
SECRET = "s" * 32


def every_public_route() -> set[str]:
    return set().union(*PUBLIC_ROUTES.values())


def routes_of(groups: set[str]) -> set[str]:
    return set().union(*(PUBLIC_ROUTES[group] for group in groups))


def bots_router_with_everything_on() -> set[str]:
    """The paths of the bot's app as bot/service.py assembles it, each optional part switched on (the route
    factories only keep their arguments: nothing here is called)."""

    async def publish(message: Any) -> None:
        raise AssertionError("not called")

    def clock() -> datetime:
        return datetime.now(UTC)

    nothing = cast(Any, None)
    app = build_app(nothing, nothing, nothing)
    app.add_routes(sns_routes(publish, ["arn:aws:sns:us-east-1:123456789012:finetune-events"], SnsVerifier()))
    app.add_routes(aliyun_routes(publish, SECRET))
    app.add_routes(costs_routes(nothing, SECRET, ["ml-research"], clock))
    app.add_routes([events_route(nothing, SECRET, "/finetune")])
    app.add_routes(pager_routes(nothing, clock, SECRET, SECRET))
    return {resource.canonical for resource in app.router.resources()}


def test_the_bot_serves_exactly_the_listed_public_and_internal_routes() -> None:
    served = bots_router_with_everything_on()
    assert served == every_public_route() | INTERNAL_ROUTES, "classify a new route in bot/public_routes.py"
    assert not every_public_route() & INTERNAL_ROUTES
    assert {"/pagerduty/webhook", "/opsgenie/webhook"} <= every_public_route()


def cfn(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.load((DEPLOY / name).read_text(), Loader=_CfnLoader)
    return document["Resources"]


def test_the_aws_load_balancer_forwards_its_groups_over_https_only() -> None:
    resources = cfn("aws/bot.yaml")
    listeners = {name: r["Properties"] for name, r in resources.items() if r["Type"].endswith("::Listener")}
    assert [(p["Protocol"], p["Port"]) for p in listeners.values()] == [("HTTPS", 443)]  # no plain HTTP listener
    (listener_name,) = listeners
    assert listeners[listener_name]["DefaultActions"][0]["Type"] == "fixed-response"  # nothing else forwarded
    forwarded: list[str] = []
    for rule in (r["Properties"] for r in resources.values() if r["Type"].endswith("::ListenerRule")):
        assert rule["ListenerArn"] == {"Ref": listener_name}
        assert [action["Type"] for action in rule["Actions"]] == ["forward"]
        (condition,) = rule["Conditions"]
        assert condition["Field"] == "path-pattern"
        values = condition["PathPatternConfig"]["Values"]
        assert len(values) <= 5  # the load balancer's limit per rule
        forwarded += values
    assert sorted(forwarded) == sorted(routes_of(TEMPLATE_GROUPS["aws/bot.yaml"]))


def test_the_alibaba_load_balancer_forwards_its_groups_over_https_only() -> None:
    template = yaml.safe_load((DEPLOY / "aliyun" / "bot.ros.yaml").read_text())
    resources = template["Resources"]
    listeners = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "ALIYUN::ALB::Listener"}
    assert [(p["ListenerProtocol"], p["ListenerPort"]) for p in listeners.values()] == [("HTTPS", 443)]
    (listener_name,) = listeners
    forwarded: list[str] = []
    refused: list[str] = []
    for rule in (r["Properties"] for r in resources.values() if r["Type"] == "ALIYUN::ALB::Rule"):
        assert rule["ListenerId"] == {"Ref": listener_name}
        (condition,) = rule["RuleConditions"]
        assert condition["Type"] == "Path"
        (action,) = rule["RuleActions"]
        if action["Type"] == "ForwardGroup":
            forwarded += condition["PathConfig"]["Values"]
        else:
            assert action["Type"] == "FixedResponse" and action["FixedResponseConfig"]["HttpCode"] == "404"
            refused += condition["PathConfig"]["Values"]
    assert sorted(forwarded) == sorted(routes_of(TEMPLATE_GROUPS["aliyun/bot.ros.yaml"]))
    assert refused == ["/*"]  # and every other path is answered 404 by the load balancer


def test_the_kubernetes_ingress_forwards_every_public_route_over_https_only() -> None:
    documents = yaml.safe_load_all((DEPLOY / "kubernetes" / "finetune-bot.yaml").read_text())
    (ingress,) = [doc for doc in documents if doc["kind"] == "Ingress"]
    spec = ingress["spec"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    tls_hosts = {host for entry in spec["tls"] for host in entry["hosts"]}
    paths: list[str] = []
    for rule in spec["rules"]:
        assert rule["host"] in tls_hosts  # every routed host has its certificate: HTTPS
        for path in rule["http"]["paths"]:
            assert path["pathType"] == "Exact"  # a prefix would publish the bot's next route unasked
            paths.append(path["path"])
    assert sorted(paths) == sorted(routes_of(TEMPLATE_GROUPS["kubernetes/finetune-bot.yaml"]))
