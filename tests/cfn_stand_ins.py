"""Deploy our CloudFormation templates, as written, on moto's CloudFormation (server mode).

moto's CloudFormation implements about a hundred resource types and skips the others (a GetAtt of a skipped one
then fails the whole stack). The templates do not bend to that. :func:`deploy` takes a template as it is, takes out
the resources whose type moto lacks (:func:`moto_lacks` says which; the tests assert that list), creates each of them
the way CloudFormation would, through its service's own API where moto has one (SNS subscriptions, topic and queue
policies, FIS experiment templates, Secrets Manager secrets) or through a local stand-in the test hands in (an
ElastiCache replication group becomes a TLS Valkey on loopback), and writes their Ref and GetAtt values where the
rest of the template refers to them. Stand-ins that need nothing from the stack are made before it, the others
after it, from the stack's own resources.

Conditions are CloudFormation's own: :func:`conditioned` evaluates the template's ``Conditions`` for the stack's
parameters (``Fn::Equals``, ``Fn::Not``, ``Fn::And``, ``Fn::Or``, ``Condition``), leaves out the resources and
outputs whose condition is false, and replaces each ``Fn::If`` by its chosen branch (``AWS::NoValue`` removes the
property or list item). A resource that still refers to one left out fails as CloudFormation fails the template.
The template's ``Rules`` are checked first (:func:`check_rules`), as CloudFormation checks them before it makes
anything; moto gets the template without them.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.test_images import _CfnLoader

ROOT = Path(__file__).resolve().parent.parent
PSEUDO = {"AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::StackName", "AWS::URLSuffix", "AWS::NoValue"}
_SUB = re.compile(r"\$\{([^}!][^}]*)\}")
_DYNAMIC = re.compile(r"\{\{resolve:secretsmanager:([^}]+?)\}\}")

Values = dict[str, Any]  # "Ref" and attribute names -> value
Maker = Callable[["Context", dict[str, Any]], Values]


def load_template(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.load((ROOT / "deploy" / "aws" / name).read_text(), Loader=_CfnLoader)
    return document


@functools.cache
def moto_types() -> frozenset[str]:
    """The resource types moto's CloudFormation implements (the moto the server runs is this one)."""
    import moto.cloudformation.parsing  # noqa: F401  (imports every model module moto's CloudFormation knows)
    from moto.core.common_models import CloudFormationModel

    def subclasses(cls: type) -> Iterator[type]:
        sub: type
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = set()
    for cls in subclasses(CloudFormationModel):
        try:
            kind = cls.cloudformation_type()  # type: ignore[attr-defined]
        except NotImplementedError:
            continue
        if kind:
            found.add(kind)
    return frozenset(found)


def moto_lacks(template: dict[str, Any]) -> set[str]:
    return {body["Type"] for body in template["Resources"].values()} - moto_types()


@dataclass
class Context:
    """What intrinsic functions resolve against: parameters, pseudo parameters, imports, made resources."""

    clients: Callable[[str], Any]
    parameters: dict[str, Any]
    stack_name: str
    region: str = "us-east-1"
    account: str = "123456789012"
    values: dict[str, Values] = field(default_factory=dict)  # logical id -> its Ref and attributes
    imports: dict[str, str] = field(default_factory=dict)

    def pseudo(self, name: str) -> Any:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": "aws",
            "AWS::StackName": self.stack_name,
            "AWS::URLSuffix": "amazonaws.com",
        }[name]

    def ref(self, name: str) -> Any:
        if name in self.parameters:
            return self.parameters[name]
        if name in PSEUDO:
            return self.pseudo(name)
        return self.values[name]["Ref"]

    def attr(self, name: str, attribute: str) -> Any:
        return self.values[name][attribute]

    def resolve(self, node: Any) -> Any:
        """``node`` with every intrinsic function evaluated and every dynamic reference resolved."""
        if isinstance(node, list):
            return [self.resolve(item) for item in node]
        if isinstance(node, str):
            return _DYNAMIC.sub(lambda m: self._secret(m.group(1)), node)
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, value),) = node.items()
            if key == "Ref":
                return self.ref(value)
            if key == "Fn::GetAtt":
                return self.attr(value[0], value[1])
            if key == "Fn::Sub":
                template, extra = (value, {}) if isinstance(value, str) else (value[0], self.resolve(value[1]))
                return self.resolve(
                    _SUB.sub(
                        lambda m: str(extra[m.group(1)] if m.group(1) in extra else self._sub_name(m.group(1))),
                        template,
                    )
                )
            if key == "Fn::Join":
                return str(value[0]).join(str(item) for item in self.resolve(value[1]))
            if key == "Fn::ImportValue":
                return self.imports[self.resolve(value)]
        return {key: self.resolve(item) for key, item in node.items()}

    def _sub_name(self, name: str) -> Any:
        if "." in name and name not in PSEUDO:
            logical, attribute = name.split(".", 1)
            return self.attr(logical, attribute)
        return self.ref(name)

    def _secret(self, reference: str) -> str:
        secret_id, _, key = reference.partition(":SecretString:")
        value = str(self.clients("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"])
        return str(json.loads(value)[key.split(":")[0]]) if key else value


class TemplateError(ValueError):
    """What CloudFormation would refuse before creating anything."""


def evaluate_conditions(template: dict[str, Any], ctx: Context) -> dict[str, bool]:
    """Each of the template's conditions, true or false for ``ctx``'s parameters."""
    specs: dict[str, Any] = template.get("Conditions", {})
    known: dict[str, bool] = {}
    evaluating: list[str] = []

    def condition(name: str) -> bool:
        if name not in specs:
            raise TemplateError(f"no condition named {name!r}")
        if name in evaluating:
            raise TemplateError(f"condition {name!r} refers to itself: {' -> '.join([*evaluating, name])}")
        if name not in known:
            evaluating.append(name)
            known[name] = truth(specs[name])
            evaluating.pop()
        return known[name]

    def truth(node: Any) -> bool:
        if not (isinstance(node, dict) and len(node) == 1):
            raise TemplateError(f"not a condition: {node!r}")
        ((key, value),) = node.items()
        if key == "Condition":
            return condition(value)
        if key == "Fn::Equals":
            left, right = (ctx.resolve(item) for item in value)
            return str(left) == str(right)  # parameters are text; CloudFormation compares them so
        if key == "Fn::Not":
            (inner,) = value
            return not truth(inner)
        if key == "Fn::And":
            return all([truth(item) for item in value])  # every one evaluated: a bad one fails, as in CloudFormation
        if key == "Fn::Or":
            return any([truth(item) for item in value])
        raise TemplateError(f"{key} is not a condition function")

    return {name: condition(name) for name in specs}


def check_rules(template: dict[str, Any], ctx: Context) -> None:
    """CloudFormation's ``Rules``: where a rule's ``RuleCondition`` holds, each of its ``Assertions`` must, else the
    stack is refused with the assertion's description (``Fn::Equals``, ``Fn::Not``, ``Fn::And``, ``Fn::Or``,
    ``Fn::Contains``; a list parameter is its list of values)."""
    types = {name: str(spec.get("Type", "String")) for name, spec in template.get("Parameters", {}).items()}

    def value(node: Any) -> Any:
        if isinstance(node, dict) and set(node) == {"Ref"} and node["Ref"] in types:
            kind, raw = types[node["Ref"]], str(ctx.ref(node["Ref"]))
            return raw.split(",") if kind == "CommaDelimitedList" or kind.startswith("List<") else raw
        if isinstance(node, list):
            return [value(item) for item in node]
        return ctx.resolve(node)

    def truth(node: Any) -> bool:
        if not (isinstance(node, dict) and len(node) == 1):
            raise TemplateError(f"not a rule function: {node!r}")
        ((key, args),) = node.items()
        if key == "Fn::Equals":
            left, right = (value(item) for item in args)
            return str(left) == str(right)
        if key == "Fn::Not":
            (inner,) = args
            return not truth(inner)
        if key == "Fn::And":
            return all([truth(item) for item in args])
        if key == "Fn::Or":
            return any([truth(item) for item in args])
        if key == "Fn::Contains":
            listed, item = value(args[0]), value(args[1])
            return str(item) in [str(each) for each in listed]
        raise TemplateError(f"{key} is not a rule function")

    for name, rule in template.get("Rules", {}).items():
        if "RuleCondition" in rule and not truth(rule["RuleCondition"]):
            continue
        for assertion in rule["Assertions"]:
            if not truth(assertion["Assert"]):
                raise TemplateError(f"rule {name}: {assertion.get('AssertDescription', 'an assertion is false')}")


_NO_VALUE = object()


def conditioned(template: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """``template`` as CloudFormation creates it for ``ctx``'s parameters, each left out taking its default (see
    the module docstring)."""
    for name, spec in template.get("Parameters", {}).items():
        ctx.parameters.setdefault(name, spec.get("Default"))
    truths = evaluate_conditions(template, ctx)

    def kept(section: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, body in section.items():
            if "Condition" in body and not truths[_named(truths, body["Condition"])]:
                continue
            out[name] = {key: value for key, value in body.items() if key != "Condition"}
        return out

    def chosen(node: Any) -> Any:
        if isinstance(node, list):
            return [item for item in (chosen(item) for item in node) if item is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if node == {"Ref": "AWS::NoValue"}:
            return _NO_VALUE
        if len(node) == 1 and "Fn::If" in node:
            name, then, otherwise = node["Fn::If"]
            return chosen(then if truths[_named(truths, name)] else otherwise)
        out = {key: chosen(value) for key, value in node.items()}
        return {key: value for key, value in out.items() if value is not _NO_VALUE}

    left = ("Conditions", "Rules", "Resources", "Outputs")
    result = {key: value for key, value in template.items() if key not in left}
    result["Resources"] = chosen(kept(template["Resources"]))
    result["Outputs"] = chosen(kept(template.get("Outputs", {})))
    gone = set(template["Resources"]) - set(result["Resources"])
    for name, body in [*result["Resources"].items(), *result["Outputs"].items()]:
        depends = body.get("DependsOn", [])
        missing = (refs(body) | set([depends] if isinstance(depends, str) else depends)) & gone
        if missing:
            raise TemplateError(f"{name} refers to {sorted(missing)}, which its condition leaves out")
    return result


def _named(truths: dict[str, bool], name: str) -> str:
    if name not in truths:
        raise TemplateError(f"no condition named {name!r}")
    return name


def refs(node: Any) -> set[str]:
    """Logical names ``node`` refers to (Ref, GetAtt, ${…} of Fn::Sub)."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= refs(item)
    elif isinstance(node, dict):
        if len(node) == 1 and "Ref" in node:
            return {node["Ref"]}
        if len(node) == 1 and "Fn::GetAtt" in node:
            return {node["Fn::GetAtt"][0]}
        if len(node) == 1 and "Fn::Sub" in node:
            value = node["Fn::Sub"]
            template, extra = (value, {}) if isinstance(value, str) else (value[0], value[1])
            found |= {m.group(1).split(".")[0] for m in _SUB.finditer(template) if m.group(1) not in extra}
            return found | refs(extra)
        for item in node.values():
            found |= refs(item)
    return found


def substitute(node: Any, values: dict[str, Values]) -> Any:
    """``node`` with references to the stood-in resources replaced by their values."""
    if isinstance(node, list):
        return [substitute(item, values) for item in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref" and value in values:
            return values[value]["Ref"]
        if key == "Fn::GetAtt" and value[0] in values:
            return values[value[0]][value[1]]
        if key == "Fn::Sub":
            template, extra = (value, None) if isinstance(value, str) else (value[0], value[1])

            def fill(match: re.Match[str]) -> str:
                logical, _, attribute = match.group(1).partition(".")
                if logical in values and (extra is None or match.group(1) not in extra):
                    return str(values[logical][attribute or "Ref"])
                return match.group(0)

            template = _SUB.sub(fill, template)
            return {"Fn::Sub": template if extra is None else [template, substitute(extra, values)]}
    return {key: substitute(item, values) for key, item in node.items()}


# -- what CloudFormation would have done, through each service's API ---------------------------------------------


def _subscription(ctx: Context, props: dict[str, Any]) -> Values:
    reply = ctx.clients("sns").subscribe(
        TopicArn=props["TopicArn"], Protocol=props["Protocol"], Endpoint=props["Endpoint"], ReturnSubscriptionArn=True
    )
    return {"Ref": reply["SubscriptionArn"]}


def _topic_policy(ctx: Context, props: dict[str, Any]) -> Values:
    for topic in props["Topics"]:
        ctx.clients("sns").set_topic_attributes(
            TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(props["PolicyDocument"])
        )
    return {"Ref": f"{ctx.stack_name}-topic-policy"}


def _queue_policy(ctx: Context, props: dict[str, Any]) -> Values:
    for queue in props["Queues"]:
        ctx.clients("sqs").set_queue_attributes(
            QueueUrl=queue, Attributes={"Policy": json.dumps(props["PolicyDocument"])}
        )
    return {"Ref": f"{ctx.stack_name}-queue-policy"}


def _experiment_template(ctx: Context, props: dict[str, Any]) -> Values:
    reply = ctx.clients("fis").create_experiment_template(
        clientToken=uuid.uuid4().hex,
        description=props["Description"],
        roleArn=props["RoleArn"],
        stopConditions=[{"source": item["Source"]} for item in props["StopConditions"]],
        targets={
            name: {
                "resourceType": target["ResourceType"],
                "selectionMode": target["SelectionMode"],
                "resourceTags": target.get("ResourceTags", {}),
            }
            for name, target in props["Targets"].items()
        },
        actions={
            name: {"actionId": action["ActionId"], "parameters": action["Parameters"], "targets": action["Targets"]}
            for name, action in props["Actions"].items()
        },
        tags=props.get("Tags", {}),
    )
    return {"Ref": reply["experimentTemplate"]["id"]}


def _secret(ctx: Context, props: dict[str, Any]) -> Values:
    secrets = ctx.clients("secretsmanager")
    value = props.get("SecretString")
    if value is None:
        generate = props.get("GenerateSecretString", {})
        value = secrets.get_random_password(
            PasswordLength=generate.get("PasswordLength", 32),
            ExcludePunctuation=generate.get("ExcludePunctuation", False),
        )["RandomPassword"]
    reply = secrets.create_secret(Name=props["Name"], Description=props.get("Description", ""), SecretString=value)
    return {"Ref": reply["ARN"]}


def _subnet_group(ctx: Context, props: dict[str, Any]) -> Values:
    return {"Ref": f"{ctx.stack_name}-redis-subnets"}  # the stand-in server listens on loopback: no subnets


def _parameter_group(ctx: Context, props: dict[str, Any]) -> Values:
    return {"Ref": f"{ctx.stack_name}-redis-parameters", "Properties": props["Properties"]}


def _cache_user(ctx: Context, props: dict[str, Any]) -> Values:
    """An ElastiCache RBAC user (Ref: its id) or a MemoryDB ACL user (Ref: its name), as the server will apply it."""
    name = props["UserName"]
    mode = props.get("AuthenticationMode", {})
    return {
        "Ref": props.get("UserId", name),
        "UserName": name,
        "AccessString": props["AccessString"],
        "Passwords": list(mode.get("Passwords", [])),
        "NoPassword": mode.get("Type") == "no-password-required",
        "Arn": f"arn:aws:elasticache:{ctx.region}:{ctx.account}:user:{props.get('UserId', name)}",
    }


def _users(ctx: Context, ids: list[str]) -> list[Values]:
    by_ref = {values["Ref"]: values for values in ctx.values.values() if "AccessString" in values}
    return [by_ref[user] for user in ids]


def _user_group(ctx: Context, props: dict[str, Any]) -> Values:
    """An ElastiCache user group; like ElastiCache, one that holds no user named default is refused."""
    users = _users(ctx, props["UserIds"])
    if "default" not in {user["UserName"] for user in users}:
        raise TemplateError(f"user group {props['UserGroupId']} holds no user named default")
    return {"Ref": props["UserGroupId"], "Users": users}


def _acl(ctx: Context, props: dict[str, Any]) -> Values:
    """A MemoryDB ACL: its users, by name."""
    return {"Ref": props["ACLName"], "Users": _users(ctx, props["UserNames"])}


def _memorydb_subnet_group(ctx: Context, props: dict[str, Any]) -> Values:
    return {"Ref": props["SubnetGroupName"]}


def _wait_condition_handle(ctx: Context, props: dict[str, Any]) -> Values:
    """A handle nothing signals here: the bot stack's only orders resources by its Metadata (moto skips the type)."""
    return {"Ref": f"https://cloudformation-waitcondition-{ctx.region}.s3.amazonaws.com/{uuid.uuid4().hex}"}


def _memorydb_parameter_group(ctx: Context, props: dict[str, Any]) -> Values:
    return {"Ref": props["ParameterGroupName"], "Properties": props.get("Parameters", {})}


# Properties a local stand-in has no use for: where in the VPC a managed server sits (the stand-in listens on
# loopback). They are left out of the stand-in's dependencies, so it can be made before the stack.
UNUSED_PROPERTIES: dict[str, set[str]] = {
    "AWS::ElastiCache::ReplicationGroup": {"SecurityGroupIds", "CacheSubnetGroupName"},
    "AWS::ElastiCache::SubnetGroup": {"SubnetIds"},
    "AWS::ElastiCache::ServerlessCache": {"SecurityGroupIds", "SubnetIds"},
    "AWS::MemoryDB::SubnetGroup": {"SubnetIds"},
    "AWS::MemoryDB::Cluster": {"SecurityGroupIds", "SubnetGroupName"},
}

MAKERS: dict[str, Maker] = {
    "AWS::SNS::Subscription": _subscription,
    "AWS::SNS::TopicPolicy": _topic_policy,
    "AWS::SQS::QueuePolicy": _queue_policy,
    "AWS::FIS::ExperimentTemplate": _experiment_template,
    "AWS::SecretsManager::Secret": _secret,
    "AWS::ElastiCache::SubnetGroup": _subnet_group,
    "AWS::ElastiCache::ParameterGroup": _parameter_group,
    "AWS::ElastiCache::User": _cache_user,
    "AWS::ElastiCache::UserGroup": _user_group,
    "AWS::MemoryDB::SubnetGroup": _memorydb_subnet_group,
    "AWS::MemoryDB::ParameterGroup": _memorydb_parameter_group,
    "AWS::MemoryDB::User": _cache_user,
    "AWS::MemoryDB::ACL": _acl,
    "AWS::CloudFormation::WaitConditionHandle": _wait_condition_handle,
}

# GetAtt of a resource moto's CloudFormation did create, for stand-ins made after the stack.
ATTRIBUTES: dict[tuple[str, str], Callable[[Context, str], Any]] = {
    ("AWS::SQS::Queue", "Arn"): lambda ctx, url: ctx.clients("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"],
    ("AWS::IAM::Role", "Arn"): lambda ctx, name: ctx.clients("iam").get_role(RoleName=name)["Role"]["Arn"],
}


@dataclass
class Deployed:
    name: str
    outputs: dict[str, str]
    resources: dict[str, str]  # logical id -> physical id, of what moto created
    stood_in: dict[str, Values]  # logical id -> values, of what the test made
    dropped_outputs: dict[str, Any]  # outputs that name a stand-in made after the stack, resolved by the test


def deploy(
    clients: Callable[[str], Any],
    stack_name: str,
    template: dict[str, Any],
    parameters: dict[str, str],
    extra_makers: dict[str, Maker] | None = None,
) -> Deployed:
    """Create the stack on moto with the stand-ins described in the module docstring; raise if it did not create."""
    makers = {**MAKERS, **(extra_makers or {})}
    cf = clients("cloudformation")
    imports = {item["Name"]: item["Value"] for item in cf.list_exports().get("Exports", []) if "Value" in item}
    defaults = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
    region = str(cf.meta.region_name)  # the stack's region: AWS::Region, and where its stand-ins are made
    ctx = Context(clients, {**defaults, **parameters}, stack_name, region=region, imports=imports)
    check_rules(template, ctx)
    template = conditioned(template, ctx)
    supported = moto_types()
    lacking = {name: body for name, body in template["Resources"].items() if body["Type"] not in supported}
    missing = {body["Type"] for body in lacking.values()} - set(makers)
    assert not missing, f"no stand-in for {missing}"

    # Before the stack: the stand-ins that refer to nothing of it.
    pending = dict(lacking)
    progress = True
    while progress:
        progress = False
        for name, body in list(pending.items()):
            wanted = refs(_used(body)) - set(ctx.parameters) - PSEUDO
            if wanted <= set(ctx.values):
                ctx.values[name] = makers[body["Type"]](ctx, ctx.resolve(_used(body)))
                del pending[name]
                progress = True

    deployable = {key: value for key, value in template.items() if key not in ("Resources", "Outputs")}
    deployable["Resources"] = {}
    for name, body in template["Resources"].items():
        if name in lacking:
            continue
        kept = substitute(body, ctx.values)
        depends = kept.get("DependsOn")
        if depends is not None:
            depends = [depends] if isinstance(depends, str) else depends
            kept["DependsOn"] = [d for d in depends if d not in lacking]
            if not kept["DependsOn"]:
                del kept["DependsOn"]
        assert not refs(kept) & set(pending), (
            f"{name} needs a stand-in that needs the stack: {refs(kept) & set(pending)}"
        )
        deployable["Resources"][name] = kept
    outputs: dict[str, Any] = {}
    dropped: dict[str, Any] = {}
    for name, body in template.get("Outputs", {}).items():
        (dropped if refs(body) & set(pending) else outputs)[name] = substitute(body, ctx.values)
    deployable["Outputs"] = outputs

    cf.create_stack(
        StackName=stack_name,
        TemplateBody=json.dumps(deployable),
        Parameters=[{"ParameterKey": key, "ParameterValue": value} for key, value in parameters.items()],
        Capabilities=["CAPABILITY_NAMED_IAM"],
    )
    (stack,) = cf.describe_stacks(StackName=stack_name)["Stacks"]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
    resources = {  # moto names no physical id for some types (AWS::EC2::SecurityGroupIngress)
        item["LogicalResourceId"]: item.get("PhysicalResourceId", "")
        for item in cf.describe_stack_resources(StackName=stack_name)["StackResources"]
        if "LogicalResourceId" in item
    }
    assert set(resources) == set(deployable["Resources"]), "moto skipped a resource it was expected to create"

    # After the stack: the stand-ins that refer to its resources.
    for name, physical in resources.items():
        kind = template["Resources"][name]["Type"]
        ctx.values.setdefault(name, {"Ref": physical})
        for (typ, attribute), lookup in ATTRIBUTES.items():
            if typ == kind:
                ctx.values[name][attribute] = _Lazy(functools.partial(lookup, ctx, physical))
    for name, body in pending.items():
        ctx.values[name] = makers[body["Type"]](ctx, _force(ctx.resolve(_used(body))))
    resolved_dropped = {name: _force(ctx.resolve(body["Value"])) for name, body in dropped.items()}
    stood_in = {name: ctx.values[name] for name in lacking}
    return Deployed(
        stack_name,
        {item["OutputKey"]: item["OutputValue"] for item in stack.get("Outputs", [])},
        resources,
        stood_in,
        resolved_dropped,
    )


def _used(body: dict[str, Any]) -> dict[str, Any]:
    unused = UNUSED_PROPERTIES.get(body["Type"], set())
    return {key: value for key, value in body.get("Properties", {}).items() if key not in unused}


class _Lazy:
    """An attribute looked up only if something asks for it."""

    def __init__(self, get: Callable[[], Any]) -> None:
        self.get = get

    def __str__(self) -> str:
        return str(self.get())


def _force(node: Any) -> Any:
    if isinstance(node, _Lazy):
        return node.get()
    if isinstance(node, list):
        return [_force(item) for item in node]
    if isinstance(node, dict):
        return {key: _force(item) for key, item in node.items()}
    return node
