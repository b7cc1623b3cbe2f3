"""IAM and RAM policy statements of our templates, read and evaluated the way the clouds do, for the grant tests.

moto evaluates neither a policy's resources nor its conditions (its access control says so), and there is no RAM
emulator, so :func:`allowed` does the part of the clouds' evaluation our statements use: explicit Deny wins, else
any Allow whose action, resource and every condition match. Conditions: StringEquals, StringNotEquals, StringLike,
ArnEquals, ArnLike, NumericEquals, Bool and Null; a key absent from the request fails every operator but Null and
StringNotEquals (which it passes), as on AWS. Policy variables (``${aws:userid}``) in a resource or a condition's
value take the request's value of that key, literally (no wildcard in it counts); with the key absent the resource
or value matches nothing.
Templates are resolved with fixed stand-ins (:func:`resolve`), so a test names a resource as ``resolve`` makes it,
as deployed in the home region (:data:`CONDITIONS`: ``Fn::If`` takes that branch, a resource of a false condition
has no statements).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.test_images import _CfnLoader

ROOT = Path(__file__).resolve().parent.parent
PSEUDO = {
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws",
    "AWS::StackName": "finetune",
    "ALIYUN::Region": "cn-hangzhou",
    "ALIYUN::AccountId": "1234567890",
}
# The templates' conditions as the home region's stacks have them (HomeRegion empty: the whole stack).
CONDITIONS = {"IsHome": True, "IsRegion": False}
NO_VALUE = ("AWS::NoValue", "ALIYUN::NoValue")
_SUB = re.compile(r"\$\{([^}]+)\}")
_GLOB_CHARS = re.compile(r"([*?\[])")
POLICY_TYPES = ("AWS::IAM::Role", "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "ALIYUN::RAM::")


def templates() -> dict[str, dict[str, Any]]:
    """Every CloudFormation and ROS template of the project, by path relative to deploy/."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted([*(ROOT / "deploy" / "aws").glob("*.yaml"), *(ROOT / "deploy" / "aliyun").glob("*.yaml")]):
        document = yaml.load(path.read_text(), Loader=_CfnLoader)
        if isinstance(document, dict) and "Resources" in document:
            found[str(path.relative_to(ROOT / "deploy"))] = document
    return found


def _no_value(node: Any) -> bool:
    """Whether ``node`` is nothing as deployed: a NoValue, or an ``Fn::If`` whose branch is one."""
    if isinstance(node, dict) and set(node) == {"Ref"}:
        return node["Ref"] in NO_VALUE
    if isinstance(node, dict) and set(node) == {"Fn::If"}:
        condition, then, otherwise = node["Fn::If"]
        return _no_value(then if CONDITIONS[condition] else otherwise)
    return False


def ref(name: str) -> str:
    """What a Ref of a parameter or resource resolves to here."""
    return PSEUDO.get(name, f"ref-{name}")


def att(name: str, attribute: str = "Arn") -> str:
    """What a GetAtt resolves to here."""
    return f"arn:test:{name}.{attribute}"


def resolve(node: Any) -> Any:
    """The template value with Ref, Fn::Sub, Fn::GetAtt, Fn::Join and Fn::ImportValue replaced by stand-ins."""
    if isinstance(node, list):
        return [resolve(item) for item in node if not _no_value(item)]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Fn::If"}:
        condition, then, otherwise = node["Fn::If"]
        return resolve(then if CONDITIONS[condition] else otherwise)
    if set(node) == {"Ref"}:
        return ref(node["Ref"])
    if set(node) == {"Fn::GetAtt"}:
        name, attribute = node["Fn::GetAtt"]
        return att(name, attribute)
    if set(node) == {"Fn::Join"}:
        separator, parts = node["Fn::Join"]
        return separator.join(str(resolve(part)) for part in parts)
    if set(node) == {"Fn::ImportValue"}:
        return f"import-{resolve(node['Fn::ImportValue'])}"
    if set(node) == {"Fn::Sub"}:
        text, names = (node["Fn::Sub"], {}) if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"]

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"  # a literal ${...}: a policy variable
            if name in names:
                return str(resolve(names[name]))
            if "." in name and not name.startswith(("AWS::", "ALIYUN::")):
                resource, attribute = name.split(".", 1)
                return att(resource, attribute)
            return ref(name)

        return _SUB.sub(one, text)
    return {key: resolve(value) for key, value in node.items()}


@dataclass(frozen=True)
class Statement:
    """One statement of one policy, resolved; ``where`` says whose (template, resource, policy)."""

    where: str
    body: Mapping[str, Any]

    @property
    def effect(self) -> str:
        return str(self.body["Effect"])

    @property
    def actions(self) -> list[str]:
        return listed(self.body.get("Action"))

    @property
    def resources(self) -> list[str]:
        return listed(self.body.get("Resource"))


def listed(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def statements(template: str, document: Mapping[str, Any]) -> Iterator[Statement]:
    """Every permission statement (not trust policies) of every IAM or RAM resource in ``document``."""
    for name, resource in document["Resources"].items():
        kind = str(resource["Type"])
        if not kind.startswith(POLICY_TYPES) or not CONDITIONS.get(resource.get("Condition", ""), True):
            continue
        properties = resource.get("Properties", {})
        documents = [(str(properties.get("PolicyName", name)), properties.get("PolicyDocument"))]
        documents += [(str(p["PolicyName"]), p["PolicyDocument"]) for p in properties.get("Policies", [])]
        for policy, body in documents:
            for statement in resolve((body or {}).get("Statement", [])):
                yield Statement(f"{template} {name} {policy}", statement)


def policy_of(template: str, resource: str) -> list[Statement]:
    """The statements of one resource's policies (a role's inline policies, or a managed policy)."""
    found = [s for s in statements(template, templates()[template]) if s.where.split()[1] == resource]
    assert found, f"{resource} in {template} has no policy statements"
    return found


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    translated = fnmatch.translate(pattern) if case else fnmatch.translate(pattern.lower())
    return re.fullmatch(translated, value if case else value.lower()) is not None


def _substituted(text: str, context: Mapping[str, str], *, glob: bool) -> str | None:
    """``text`` with each policy variable replaced by the request's value (escaped for a glob when ``glob``), or None
    when the request lacks one (then it matches nothing)."""
    missing = False

    def one(match: re.Match[str]) -> str:
        nonlocal missing
        value = context.get(match.group(1))
        if value is None:
            missing = True
            return ""
        return _GLOB_CHARS.sub(r"[\1]", value) if glob else value

    replaced = _SUB.sub(one, text)
    return None if missing else replaced


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, str]) -> bool:
    glob = operator in ("StringLike", "ArnLike")
    values = [v for v in (_substituted(value, context, glob=glob) for value in listed(expected)) if v is not None]
    if operator == "Null":
        return (key not in context) == (values[0].lower() == "true")
    if operator == "StringNotEquals":
        return key not in context or context[key] not in values
    if key not in context:
        return False
    actual = context[key]
    if operator in ("StringEquals", "ArnEquals", "Bool"):
        return actual in values
    if glob:
        return any(_glob(value, actual) for value in values)
    if operator == "NumericEquals":
        return any(float(actual) == float(value) for value in values)
    raise AssertionError(f"the evaluator does not know the condition operator {operator}")


def _matches(statement: Statement, action: str, resource: str, context: Mapping[str, str]) -> bool:
    if not any(_glob(pattern, action, case=False) for pattern in statement.actions):
        return False
    patterns = [_substituted(pattern, context, glob=True) for pattern in statement.resources]
    if not any(_glob(pattern, resource) for pattern in patterns if pattern is not None):
        return False
    conditions: Mapping[str, Mapping[str, Any]] = statement.body.get("Condition", {})
    return all(
        _condition_holds(operator, key, expected, context)
        for operator, keys in conditions.items()
        for key, expected in keys.items()
    )


def allowed(policy: list[Statement], action: str, resource: str, context: Mapping[str, str] | None = None) -> bool:
    """Whether ``policy`` lets ``action`` on ``resource`` with request ``context`` through (explicit Deny wins)."""
    context = context or {}
    matching = [s for s in policy if _matches(s, action, resource, context)]
    return not any(s.effect == "Deny" for s in matching) and any(s.effect == "Allow" for s in matching)
