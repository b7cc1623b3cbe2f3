"""The bot's service definitions agree with the bot: the Kubernetes manifests (schema-checked by
kubernetes-validate in ``make test``) and the ECS task definition of deploy/aws/bot.yaml (cfn-lint) set only
variables the bot reads, mount the config where FINETUNE_CONFIG points, probe the port it listens on, and route
exactly the paths it serves to the outside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bot.chat.slack.app import EVENTS_PATH
from bot.http import REPORTS_PATH
from bot.public_routes import PUBLIC_ROUTES
from bot.settings import Settings, parse_file_config
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH
from bot.sources.sns_http import SNS_PATH
from tests.test_images import _CfnLoader, dockerfile

ROOT = Path(__file__).resolve().parent.parent
# Variables the bot reads besides its Settings fields: the AWS SDK's own.
SDK_VARIABLES = {"AWS_REGION"}


def manifests() -> dict[str, dict[str, Any]]:
    documents = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "finetune-bot.yaml").read_text())
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in documents}


def settings_variables() -> set[str]:
    return {name.upper() for name in Settings.model_fields}


def test_kubernetes_runs_two_replicas_on_the_bots_own_settings_and_secrets() -> None:
    found = manifests()
    deployment = found["Deployment/finetune-bot"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] >= 1000
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = found["ConfigMap/finetune-bot-env"]["data"]
    secrets = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in container["env"]}
    assert set(env) | set(secrets) <= settings_variables() | SDK_VARIABLES, "a variable the bot does not read"
    assert {"REDIS_URL", "FINETUNE_REPORT_SECRET"} <= set(secrets)  # two replicas need one external Redis
    assert all(ref["name"] == "finetune-bot" and ref["key"] == name for name, ref in secrets.items())
    assert not any(
        ref.get("optional") for name, ref in secrets.items() if name in ("REDIS_URL", "FINETUNE_REPORT_SECRET")
    )

    # The config file is where FINETUNE_CONFIG says, and it is a config the bot accepts.
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    config_map = next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]
    (file_name,) = found[f"ConfigMap/{config_map}"]["data"]
    assert env["FINETUNE_CONFIG"] == f"{mount['mountPath']}/{file_name}"
    config = parse_file_config(found[f"ConfigMap/{config_map}"]["data"][file_name], "the ConfigMap")
    assert config.aws is not None and config.policy.admins and config.policy.teams
    assert config.policy.allow is None  # no blanket grants: the owner, team and admin model decides
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {env["FINETUNE_STATE_DIR"], "/tmp"} <= writable

    port = int(env["FINETUNE_HTTP_PORT"])
    assert env["FINETUNE_HTTP_HOST"] == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["args"] == ["serve"]


def test_kubernetes_publishes_exactly_the_routes_the_outside_posts_to() -> None:
    found = manifests()
    (rule,) = found["Ingress/finetune-bot"]["spec"]["rules"]
    paths = {(p["path"], p["pathType"]) for p in rule["http"]["paths"]}
    assert paths == {(path, "Exact") for routes in PUBLIC_ROUTES.values() for path in routes}
    assert {EVENTS_PATH, SNS_PATH, REPORTS_PATH, CLOUDMONITOR_PATH, EVENTBRIDGE_PATH} < {path for path, _ in paths}
    assert found["Service/finetune-bot"]["spec"]["ports"][0]["targetPort"] == "http"
    assert found["PodDisruptionBudget/finetune-bot"]["spec"]["minAvailable"] == 1


def test_kubernetes_objects_live_in_their_own_namespace_without_an_api_token() -> None:
    found = manifests()
    namespace = found["Namespace/finetune-bot"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, document in found.items():
        if name != "Namespace/finetune-bot":
            assert document["metadata"]["namespace"] == "finetune-bot", name
    pod = found["Deployment/finetune-bot"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert found["ServiceAccount/finetune-bot"]["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def network_policies() -> dict[str, dict[str, Any]]:
    return {name.split("/", 1)[1]: doc["spec"] for name, doc in manifests().items() if doc["kind"] == "NetworkPolicy"}


def test_kubernetes_denies_every_connection_the_bot_does_not_need() -> None:
    policies = network_policies()
    found = manifests()
    # Default deny: every pod of the namespace, both directions, nothing allowed.
    deny = policies["default-deny"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}

    # The bot's own: selects the Deployment's pods, and allows only these.
    bot = policies["finetune-bot"]
    deployment = found["Deployment/finetune-bot"]["spec"]
    assert bot["podSelector"]["matchLabels"] == deployment["template"]["metadata"]["labels"]
    assert bot["policyTypes"] == ["Ingress", "Egress"]
    (container,) = deployment["template"]["spec"]["containers"]
    (port,) = container["ports"]
    sources = []
    for rule in bot["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": port["name"]}]  # the HTTP port, nothing else
        (peer,) = rule["from"]
        assert "ipBlock" not in peer  # a namespace (and pods) named, never an address range
        sources.append(peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])
    assert sources == ["ingress-nginx", "monitoring"]

    allowed = set()
    for rule in bot["egress"]:
        for item in rule["ports"]:
            allowed.add((item["protocol"], item["port"], bool(rule.get("to"))))
    assert allowed == {
        ("UDP", 53, True),  # DNS, to the cluster's resolver only
        ("TCP", 53, True),
        ("TCP", 6379, False),  # Redis
        ("TCP", 443, False),  # HTTPS out
        ("TCP", 80, True),  # EKS Pod Identity's agent, one link-local address
    }
    (dns,) = [rule for rule in bot["egress"] if {"protocol": "UDP", "port": 53} in rule["ports"]]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    (plain_http,) = [rule for rule in bot["egress"] if {"protocol": "TCP", "port": 80} in rule["ports"]]
    assert plain_http["to"] == [{"ipBlock": {"cidr": "169.254.170.23/32"}}]


def bot_stack() -> dict[str, Any]:
    document: dict[str, Any] = yaml.load((ROOT / "deploy" / "aws" / "bot.yaml").read_text(), Loader=_CfnLoader)
    return document


def test_the_ecs_task_sets_only_what_the_bot_reads_and_checks_health_as_the_image_does() -> None:
    resources = bot_stack()["Resources"]
    (container,) = resources["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    env = {item["Name"]: item["Value"] for item in container["Environment"]}
    secrets = {item["Name"] for item in container["Secrets"]}
    assert set(env) | secrets <= settings_variables() | SDK_VARIABLES
    assert {"REDIS_URL", "FINETUNE_REPORT_SECRET", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"} <= secrets
    assert env["FINETUNE_HTTP_HOST"] == "0.0.0.0" and env["FINETUNE_CLOUD"] == "aws"
    assert container["PortMappings"] == [{"ContainerPort": int(env["FINETUNE_HTTP_PORT"]), "Protocol": "tcp"}]
    health = dict(dockerfile())["HEALTHCHECK"]
    assert container["HealthCheck"]["Command"] == ["CMD", *yaml.safe_load(health.split("CMD", 1)[1])]
    assert container["ReadonlyRootFilesystem"] is True
    mounts = {m["ContainerPath"] for m in container["MountPoints"]}
    assert mounts == {"/var/lib/finetune", "/tmp"}

    group = resources["TargetGroup"]["Properties"]
    assert (group["HealthCheckPath"], group["Port"]) == ("/healthz", int(env["FINETUNE_HTTP_PORT"]))
    (condition,) = resources["BotRoutes"]["Properties"]["Conditions"]
    assert set(condition["PathPatternConfig"]["Values"]) == {EVENTS_PATH, SNS_PATH, REPORTS_PATH}
    listener = resources["HttpsListener"]["Properties"]
    assert (listener["Protocol"], listener["Port"]) == ("HTTPS", 443)
    assert listener["DefaultActions"][0]["FixedResponseConfig"]["StatusCode"] == "404"  # /metrics stays inside

    redis = resources["Redis"]["Properties"]
    assert redis["TransitEncryptionEnabled"] is True and redis["ClusterMode"] == "disabled"
    assert redis["AutomaticFailoverEnabled"] is True and redis["NumCacheClusters"] >= 2
    condition, replication_group_url, _other_stores = resources["RedisUrl"]["Properties"]["SecretString"]["Fn::If"]
    assert condition == "UseReplicationGroup"  # the default StateStore (test_aws_stacks deploys each choice)
    url = replication_group_url["Fn::Sub"]
    assert url.startswith("rediss://:{{resolve:secretsmanager:${RedisAuthToken}}}@${Redis.PrimaryEndPoint.Address}")
