"""deploy/: the Prometheus alert rules pass their own unit tests under promtool, a broken rule fails the check, and
every metric the rules and the Grafana dashboard name is one the bot's /metrics really exports (scraped from the
real HTTP app over a real Valkey: a running job's step, the work streams' lag and pending entries).

promtool is Debian's (the prometheus package's one binary, which make test takes out of the .deb and passes in
PROMTOOL, so there these tests cannot skip); run alone without it, they skip and say how to get it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from aiohttp import web

from bot.bus import EventBus
from bot.http import build_app
from bot.keys import Keys
from bot.report_gate import ReportGate
from bot.store import JobStore
from handlers.jobs import JobState
from tests.cost_jobs import week_of_jobs
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

pytestmark = pytest.mark.scenario  # promtool runs as a subprocess

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES, RULE_TESTS = DEPLOY / "prometheus" / "alerts.yaml", DEPLOY / "prometheus" / "alerts.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "finetune-bot.json"
METRIC = re.compile(r"\b(finetune_[a-z0-9_]+)\b")


def promtool() -> str:
    given = os.environ.get("PROMTOOL")
    if given:
        assert Path(given).is_file(), f"PROMTOOL={given} is not a file"
        return given
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("promtool not installed: `make .venv/bin/promtool` (Debian's prometheus package) or make test")
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_the_alert_rules_are_valid_and_pass_their_unit_tests() -> None:
    checked = run("check", "rules", RULES)
    assert checked.returncode == 0 and "SUCCESS: 7 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = run("test", "rules", RULE_TESTS)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    covered = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert covered == set(rule_exprs())  # every alert is shown to fire


def broken(tmp_path: Path, rules: str) -> Path:
    """The rule tests next to a changed copy of the rules; the path of the tests."""
    (tmp_path / "alerts.yaml").write_text(rules)
    shutil.copy(RULE_TESTS, tmp_path / "alerts.test.yaml")
    return tmp_path / "alerts.test.yaml"


def test_a_broken_rule_fails_the_check(tmp_path: Path) -> None:
    rules = RULES.read_text()
    unparsable = rules.replace("min by (instance) (finetune_redis_up) == 0", "min by (instance) (finetune_redis_up ==")
    assert unparsable != rules
    tests = broken(tmp_path, unparsable)
    assert run("check", "rules", tmp_path / "alerts.yaml").returncode != 0
    assert run("test", "rules", tests).returncode != 0
    # Valid PromQL that no longer does what its tests say: a threshold moved past the stream's lag.
    wrong = rules.replace("(finetune_stream_lag) > 100", "(finetune_stream_lag) > 1000")
    assert wrong != rules
    tests = broken(tmp_path, wrong)
    assert run("check", "rules", tmp_path / "alerts.yaml").returncode == 0
    failed = run("test", "rules", tests)
    assert failed.returncode != 0 and "FinetuneEventStreamLag" in failed.stdout + failed.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel's query as a recording rule: a typo in the dashboard fails here."""
    exprs = dashboard_exprs()
    rules = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = run("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "x", "expr": "rate(finetune_jobs[5m]"}]}]})
    )
    assert run("check", "rules", path).returncode != 0


def test_the_dashboard_is_one_grafana_dashboard_on_a_chosen_prometheus() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert dashboard["uid"] == "finetune-bot" and len({panel["id"] for panel in panels}) == len(panels)
    assert [variable["name"] for variable in dashboard["templating"]["list"]] == ["datasource"]
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and panel["targets"]
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in panels
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))  # no two panels overlap


async def scrape(redis_client: aioredis.Redis, key_prefix: str) -> str:
    """The bot's /metrics over a store with a running job (step 410) and streams with a backlog: the events stream
    3 entries ahead of its group with 1 of them delivered and not acknowledged."""
    keys = Keys(key_prefix)
    store = JobStore(redis_client, keys)
    job = week_of_jobs()[0].model_copy(update={"state": JobState.RUNNING, "step": 410})
    assert await store.create(job, {"event": "seeded"})
    bus = EventBus(redis_client, stream=keys.events, group="bot", consumer="probe")
    await bus.ensure_group()
    for n in range(3):
        await bus.publish({"type": "probe", "n": n})
    await redis_client.xreadgroup("bot", "probe", {keys.events: ">"}, count=1)
    app = build_app(store, bus, ReportGate("metrics-test-secret", store.key_salt, lambda job_id: f"file:///j/{job_id}/"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            return await response.text()
    finally:
        await runner.cleanup()


async def test_the_rules_and_the_dashboard_name_only_metrics_the_bot_exports(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    text = await scrape(redis_client, key_prefix)
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples['finetune_job_step{job_id="ft-aaaa",recipe="tiny"}'] == "410"
    assert samples['finetune_stream_lag{stream="events",group="bot"}'] == "2"
    assert samples['finetune_stream_pending{stream="events",group="bot"}'] == "1"
    assert samples["finetune_redis_up"] == "1" and samples['finetune_jobs{state="RUNNING"}'] == "1"
    exported = {name.split("{")[0] for name in samples}
    # The names outside the store's part come from the service's extra metrics (bot/service.py), not this app.
    extra = {
        "finetune_chat_delivered_total",
        "finetune_chat_dropped_total",
        "finetune_chat_card_edits_total",
        "finetune_chat_cards_coalesced_total",
        "finetune_cloud_events_refused_total",
        "finetune_sns_sha1_refused_total",
    }
    used = {name for expr in [*rule_exprs().values(), *dashboard_exprs()] for name in METRIC.findall(expr)}
    assert used - extra <= exported, used - extra - exported
    assert extra <= used  # the dashboard shows them all
