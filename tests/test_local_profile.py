"""The local cloud's profile of a real cloud (bot/cloud/local/profile.py) and its timeline (profile_clock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cloud.local.profile import AWS_P5, INSTANT, load_profile
from bot.cloud.local.profile_clock import ProfileClock
from bot.errors import ConfigError
from bot.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]


class Wall:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_the_built_in_profiles_and_a_file_of_each_kind_with_the_same_keys(tmp_path: Path) -> None:
    assert load_profile("") == INSTANT and load_profile("instant").instant
    p5 = load_profile("aws-p5")
    assert p5 == AWS_P5 and not p5.instant and p5.launch_seconds - p5.launch_spread_seconds >= 60
    assert p5.launch_seconds + p5.launch_spread_seconds <= 180  # AWS's one to three minutes
    assert p5.fetch_seconds() == pytest.approx(112.0)  # 140 GB at 10 Gb/s
    keys = {"launch_seconds": 90, "restore_bytes_per_second": 5e8, "fresh_bytes": 10**9, "zone_capacity": 2}
    (tmp_path / "cloud.toml").write_text("\n".join(f"{k} = {v}" for k, v in keys.items()))
    (tmp_path / "cloud.json").write_text(json.dumps(keys))
    (tmp_path / "cloud.yaml").write_text("\n".join(f"{k}: {v}" for k, v in keys.items()))
    for name in ("cloud.toml", "cloud.json", "cloud.yaml"):
        profile = load_profile(str(tmp_path / name), time_scale=0.5)
        assert (profile.launch_seconds, profile.zone_capacity, profile.time_scale) == (90, 2, 0.5)
        assert profile.fetch_seconds() == 2.0 and profile.name == "cloud"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("launch_seconds = -1", "launch_seconds"),
        ("zone_capacity = 0", "zone_capacity"),
        ("restore_bytes_per_second = 0", "restore_bytes_per_second"),
        ("time_scale = 0", "time_scale"),
        ("launch_secs = 3", "launch_secs"),  # a misspelt key is refused, not ignored
        ("launch_seconds = ", "not valid toml"),
        ('launch_seconds = "slow"', "launch_seconds"),
    ],
)
def test_a_bad_profile_value_is_refused_in_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_profile(str(path))
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_an_unknown_name_a_missing_file_and_a_bad_time_scale_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a built-in profile"):
        load_profile("aws-p6")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_profile(str(tmp_path / "none.yaml"))
    with pytest.raises(ConfigError, match="time scale"):
        load_profile("aws-p5", time_scale=0)
    with pytest.raises(ConfigError, match="FINETUNE_LOCAL_PROFILE"):
        load_settings(finetune_local_profile="aws-p6")


def test_the_bot_refuses_a_bad_profile_with_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FINETUNE_STATE_DIR": str(tmp_path / "state")}
    for name, value in (("FINETUNE_LOCAL_PROFILE", "aws-p6"), ("FINETUNE_LOCAL_TIME_SCALE", "0")):
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", "check"], env={**env, name: value}, capture_output=True, text=True
        )
        assert done.returncode == 2 and name in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_lone_boot_takes_the_middle_a_gang_waits_for_its_expected_slowest_and_boots_overlap() -> None:
    wall = Wall()
    clock = ProfileClock(AWS_P5.model_copy(update={"time_scale": 0.01}), wall=wall)
    start = clock.now()
    fetch = AWS_P5.fetch_seconds()
    boots = [clock.boot("za") for _ in range(4)]  # four nodes launched side by side
    assert boots == pytest.approx([120 + fetch, 140 + fetch, 150 + fetch, 156 + fetch])  # 60 + 120·k/(k+1)
    assert clock.now() == start  # nothing jumps while they are held
    wall.t += max(boots) * 0.01  # the last one's hold is over on the wall clock
    assert clock.now() == pytest.approx(start + max(boots))  # the profile's clock went with them, once
    assert clock.boot("za") == pytest.approx(120 + fetch)  # alone again: a replacement gets the middle


def test_a_zone_boots_at_most_its_capacity_at_once_the_rest_in_a_second_wave() -> None:
    wall = Wall()
    clock = ProfileClock(AWS_P5.model_copy(update={"time_scale": 0.01}), wall=wall)
    boots = [clock.boot("za") for _ in range(6)]
    first_wave_ends = sorted(boots[:4])
    assert boots[4] > first_wave_ends[0] + AWS_P5.launch_seconds  # waits for a slot, then boots
    assert clock.boot("zb") == pytest.approx(120 + AWS_P5.fetch_seconds())  # another zone has its own slots


def test_the_instant_profile_holds_nothing() -> None:
    clock = ProfileClock(INSTANT, wall=Wall())
    start = clock.now()
    assert clock.boot("za") == 0.0 and clock.now() == start


def test_a_gangs_nodes_of_one_generation_boot_together_however_late_the_second_launch_call_comes() -> None:
    """A busy machine can take longer between a gang's two launch calls than node 0's held boot: the second node
    still counts node 0 as booting beside it (one launch on a cloud), and the next generation's lone replacement
    gets the middle again."""
    wall = Wall()
    clock = ProfileClock(AWS_P5.model_copy(update={"time_scale": 0.01}), wall=wall)
    fetch = AWS_P5.fetch_seconds()
    first = clock.boot("za", "ft-1/1")
    wall.t += first * 0.01 + 5.0  # node 0's hold is over before node 1's launch call
    assert clock.boot("za", "ft-1/1") == pytest.approx(140 + fetch)
    wall.t += 10.0  # every hold over
    assert clock.boot("za", "ft-2/1") == pytest.approx(120 + fetch)  # another job's launch is its own
    wall.t += 10.0
    assert clock.boot("za", "ft-1/2") == pytest.approx(120 + fetch)  # a replacement, alone in its generation
