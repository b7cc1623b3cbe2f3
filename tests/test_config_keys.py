"""A key the configuration file does not have is one line naming it and the closest key it has there, whatever
the depth (a section, a list of recipes, a team in a mapping); a key close to nothing is named alone."""

from __future__ import annotations

import pytest

from bot.config_keys import closest_key, keys_at
from bot.settings import ConfigError, FileConfig, parse_file_config


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("policy:\n  admin: ['console:ana']\n", "policy.admin: no such key (did you mean policy.admins?)"),
        ("polcy: {}\n", "polcy: no such key (did you mean policy?)"),
        ("policy:\n  spot:\n    tick_second: 60\n", "no such key (did you mean policy.spot.tick_seconds?)"),
        (
            "policy:\n  teams:\n    ml:\n      member: []\n",
            "policy.teams.ml.member: no such key (did you mean policy.teams.ml.members?)",
        ),
        (
            "recipes:\n  - {name: a, description: d, model: m, command: [x], paramters: {}}\n",
            "recipes.0.paramters: no such key (did you mean recipes.0.parameters?)",
        ),
        (
            "aws:\n  bucket: b\n  image_id: ami-1\n  regoin: eu-west-1\n",
            "aws.regoin: no such key (did you mean aws.region?)",
        ),
        ("zzz: 1\n", "zzz: no such key"),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_file_config(text, "bot.yaml")
    assert said in str(bad.value) and "\n" not in str(bad.value)
    if "did you mean" not in said:
        assert "did you mean" not in str(bad.value)


def test_the_keys_at_a_place_are_the_models_own() -> None:
    assert "admins" in keys_at(FileConfig, ["policy"]) and "recipes" in keys_at(FileConfig, [])
    assert "bucket" in keys_at(FileConfig, ["aws"])  # an optional section
    assert keys_at(FileConfig, ["policy", "admins", 0]) == []  # a string: no keys
    assert closest_key(FileConfig, ["policy", "lifecycle", "stop_timeout"]) == "stop_timeout_seconds"
    assert closest_key(FileConfig, []) is None
