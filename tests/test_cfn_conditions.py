"""tests/cfn_stand_ins.py's Conditions and Rules: what CloudFormation creates for given parameters, and what it refuses.

The bot stack's StateStore (deploy/aws/bot.yaml) is chosen by conditions; tests/test_aws_stacks.py deploys each
choice. Here the evaluation itself, on a small template that uses every condition function.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.cfn_stand_ins import Context, TemplateError, check_rules, conditioned, evaluate_conditions
from tests.test_images import _CfnLoader

TEMPLATE = """
Parameters:
  Store: {Type: String, Default: a}
  Replicas: {Type: Number, Default: 1}
Conditions:
  IsA: !Equals [!Ref Store, a]
  IsB: !Equals [b, !Ref Store]
  NotA: !Not [!Condition IsA]
  Replicated: !Not [!Equals [!Ref Replicas, 0]]
  AWithReplicas: !And [!Condition IsA, !Condition Replicated]
  AOrB: !Or [!Condition IsA, !Condition IsB]
Resources:
  A:
    Type: T::A
    Condition: IsA
    Properties:
      Replicas: !If [Replicated, !Ref Replicas, !Ref AWS::NoValue]
      Zones: [one, !If [AWithReplicas, two, !Ref AWS::NoValue]]
  B:
    Type: T::B
    Condition: NotA
  Always:
    Type: T::C
    Properties:
      Store: !If [IsA, !Ref A, !If [IsB, !Ref B, none]]
      Known: !If [AOrB, known, !Ref AWS::NoValue]
Outputs:
  OfA:
    Condition: IsA
    Value: !GetAtt A.Arn
"""


def _template(text: str = TEMPLATE) -> dict[str, Any]:
    document: dict[str, Any] = yaml.load(text, Loader=_CfnLoader)
    return document


def _ctx(**parameters: str) -> Context:
    defaults = {name: str(spec["Default"]) for name, spec in _template()["Parameters"].items()}
    return Context(lambda service: None, {**defaults, **parameters}, "stack")


def test_each_condition_function_evaluates_as_cloudformation_does() -> None:
    assert evaluate_conditions(_template(), _ctx()) == {
        "IsA": True,
        "IsB": False,
        "NotA": False,
        "Replicated": True,
        "AWithReplicas": True,
        "AOrB": True,
    }
    assert evaluate_conditions(_template(), _ctx(Store="b", Replicas="0")) == {
        "IsA": False,
        "IsB": True,
        "NotA": True,
        "Replicated": False,
        "AWithReplicas": False,
        "AOrB": True,
    }
    assert evaluate_conditions(_template(), _ctx(Store="c"))["AOrB"] is False


def test_resources_outputs_and_fn_if_follow_the_conditions() -> None:
    chosen = conditioned(_template(), _ctx())
    assert set(chosen["Resources"]) == {"A", "Always"} and set(chosen["Outputs"]) == {"OfA"}
    assert "Conditions" not in chosen and "Condition" not in chosen["Resources"]["A"]
    assert chosen["Resources"]["A"]["Properties"] == {"Replicas": {"Ref": "Replicas"}, "Zones": ["one", "two"]}
    assert chosen["Resources"]["Always"]["Properties"] == {"Store": {"Ref": "A"}, "Known": "known"}

    other = conditioned(_template(), _ctx(Store="b", Replicas="0"))
    assert set(other["Resources"]) == {"B", "Always"} and other["Outputs"] == {}
    assert other["Resources"]["Always"]["Properties"]["Store"] == {"Ref": "B"}

    neither = conditioned(_template(), _ctx(Store="c"))
    assert neither["Resources"]["Always"]["Properties"] == {"Store": "none"}  # AWS::NoValue: no Known at all


def test_a_reference_to_a_resource_its_condition_left_out_is_refused() -> None:
    broken = TEMPLATE.replace("Store: !If [IsA, !Ref A, !If [IsB, !Ref B, none]]", "Store: !Ref A")
    assert conditioned(_template(broken), _ctx())["Resources"]["Always"]["Properties"]["Store"] == {"Ref": "A"}
    with pytest.raises(TemplateError, match=r"Always refers to \['A'\]"):
        conditioned(_template(broken), _ctx(Store="b"))


@pytest.mark.parametrize(
    ("conditions", "error"),
    [
        ("  Loop: !Not [!Condition Loop]", "refers to itself"),
        ("  Bad: !Equals [!Ref Store, a]\n  Worse: !Not [!Condition Missing]", "no condition named 'Missing'"),
        ("  Odd: !Join [',', [a]]", "not a condition function"),
    ],
)
def test_a_malformed_condition_is_a_clear_error(conditions: str, error: str) -> None:
    text = "Parameters:\n  Store: {Type: String, Default: a}\nConditions:\n" + conditions + "\nResources: {}\n"
    with pytest.raises(TemplateError, match=error):
        evaluate_conditions(_template(text), _ctx())


RULES = """
Parameters:
  Certificate: {Type: String, Default: ""}
  Subnets: {Type: CommaDelimitedList, Default: ""}
Rules:
  SubnetsWithACertificate:
    RuleCondition: !Not [!Equals [!Ref Certificate, ""]]
    Assertions:
      - Assert: !Not [!Contains [!Ref Subnets, ""]]
        AssertDescription: a certificate needs subnets
Resources: {}
"""


def _rules_ctx(**parameters: str) -> Context:
    return Context(lambda service: None, {"Certificate": "", "Subnets": "", **parameters}, "stack")


def test_a_rule_refuses_parameters_its_assertion_does_not_hold_for() -> None:
    template = _template(RULES)
    check_rules(template, _rules_ctx())  # the rule's condition is false: nothing asserted
    check_rules(template, _rules_ctx(Certificate="arn:cert", Subnets="subnet-a,subnet-b"))
    with pytest.raises(TemplateError, match="rule SubnetsWithACertificate: a certificate needs subnets"):
        check_rules(template, _rules_ctx(Certificate="arn:cert"))
    with pytest.raises(TemplateError, match="not a rule function"):
        check_rules(_template(RULES.replace("!Contains", "!Join")), _rules_ctx(Certificate="arn:cert"))
