"""What `sparkstack metrics write-config` writes, judged by the real tools (Debian's `prometheus`
and `prometheus-alertmanager`, installed by scripts/provision.sh): promtool checks the config and
the rules and runs rule unit tests whose series fire and do not fire each alert; amtool checks the
Alertmanager config, and a real Alertmanager delivers an alert to a webhook receiver here."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.cli.commands import main
from prom_tools import free_port, wait_ready
from launcher.plan import monitoring
from click.testing import CliRunner

TOOLS = ("promtool", "amtool", "prometheus-alertmanager")


@pytest.fixture(autouse=True)
def tools():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run scripts/provision.sh (apt-get install prometheus "
                    "prometheus-alertmanager)")


@pytest.fixture
def written(tmp_path):
    result = CliRunner().invoke(main, ["metrics", "write-config", str(tmp_path), "--webhook",
                                       "http://127.0.0.1:5001/alerts"])
    assert result.exit_code == 0, result.output
    return tmp_path


def run(*argv, cwd=None):
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_promtool_accepts_the_config_and_rules(written):
    rc, said = run("promtool", "check", "config", str(written / "prometheus.yml"))
    assert rc == 0, said
    rc, said = run("promtool", "check", "rules", str(written / monitoring.RULES_FILE))
    assert rc == 0 and "7 rules found" in said, said
    rc, said = run("amtool", "check-config", str(written / "alertmanager.yml"))
    assert rc == 0, said


def test_promtool_sees_a_broken_rule(tmp_path):
    """The check can fail: a rule with a PromQL error is refused."""
    rules = monitoring.alert_rules()
    rules["groups"][0]["rules"][0]["expr"] = "sparkstack_memory_available_bytes <"
    (tmp_path / "r.yml").write_text(yaml.safe_dump(rules))
    rc, said = run("promtool", "check", "rules", str(tmp_path / "r.yml"))
    assert rc != 0 and "parse error" in said, said


def rank(r: int, **extra) -> str:
    labels = {"cluster": "c", "rank": str(r), "host": f"spark{r + 1}", **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def alert(name: str, labels: dict, summary: str) -> dict:
    """What promtool must find firing: the rule's own labels and fix, our labels and summary."""
    rule = next(r for r in monitoring.alert_rules()["groups"][0]["rules"] if r["alert"] == name)
    return {"exp_labels": {**rule["labels"], **labels},
            "exp_annotations": {"summary": summary, "fix": rule["annotations"]["fix"]}}


# Per alert: its input series (one rank or cluster that must fire, one that must not), and when
# it is checked: before its `for` (nothing yet) and after (only the bad one).
CASES = {
    "SparkstackMemoryBelowFloor": (
        [(f"sparkstack_memory_available_bytes{rank(0)}", "20e9x20"), (f"sparkstack_memory_floor_bytes{rank(0)}", "8e9x20"),
         (f"sparkstack_memory_available_bytes{rank(1)}", "5e9x20"), (f"sparkstack_memory_floor_bytes{rank(1)}", "8e9x20")],
        "30s", "5m", [({"cluster": "c", "rank": "1", "host": "spark2"},
                       "c rank 1 (spark2): MemAvailable 4.657GiB, below the planned floor")]),
    "SparkstackEngineDown": (
        [(f"sparkstack_engine_running{rank(0)}", "1x20"), (f"sparkstack_engine_running{rank(1)}", "1 1 0x18")],
        "2m30s", "5m", [({"cluster": "c", "rank": "1", "host": "spark2"}, "c rank 1 (spark2): the engine container is not running")]),
    "SparkstackRankNotSampled": (
        [(f"sparkstack_sampler_up{rank(0)}", "1x20"), (f"sparkstack_sampler_up{rank(1)}", "0x20")],
        "1m", "5m", [({"cluster": "c", "rank": "1", "host": "spark2"},
                      "c rank 1 (spark2): no sample from the rank (SSH or the rank itself is down)")]),
    "SparkstackRestartLoop": (
        [('sparkstack_restarts_total{cluster="bad"}', "0 1 2 3 3 3"), ('sparkstack_restarts_total{cluster="good"}', "0 1 1 1 1 1")],
        "2m", "5m", [({"cluster": "bad"}, "bad: the supervisor re-deployed 3 times in the last hour")]),
    "SparkstackWedged": (
        [('vllm:num_requests_running{cluster="bad",engine="0"}', "1x20"), ('vllm:generation_tokens_total{cluster="bad",engine="0"}', "5x20"),
         ('vllm:num_requests_running{cluster="good",engine="0"}', "1x20"), ('vllm:generation_tokens_total{cluster="good",engine="0"}', "0+10x20")],
        "2m", "6m", [({"cluster": "bad"}, "bad: requests run but no token was produced for 2 minutes")]),
    "SparkstackFabricErrors": (
        [(f"sparkstack_fabric_errors_total{rank(0, hca='rocep1s0f0', counter='link_downed')}", "0x20"),
         (f"sparkstack_fabric_errors_total{rank(1, hca='rocep1s0f1', counter='out_of_sequence')}", "0 0 0 0 0 0 0 1 2 2 2")],
        "5m", "9m", [({"cluster": "c", "rank": "1", "host": "spark2", "hca": "rocep1s0f1", "counter": "out_of_sequence"},
                      "c rank 1 (spark2): rocep1s0f1 out_of_sequence rose in the last 5 minutes")]),
    "SparkstackSpecAcceptanceLow": (
        [(f'{monitoring.ACCEPTED}{{cluster="bad",engine="0"}}', "0+30x30"), (f'{monitoring.DRAFTS}{{cluster="bad",engine="0"}}', "0+60x30"),
         (f'{monitoring.ACCEPTED}{{cluster="good",engine="0"}}', "0+90x30"), (f'{monitoring.DRAFTS}{{cluster="good",engine="0"}}', "0+60x30")],
        "8m", "25m", [({"cluster": "bad"}, "bad: 1.50 accepted tokens per step, below the recipe's 1.8")]),
}


def test_every_alert_fires_and_does_not_fire(written):
    assert set(CASES) == {r["alert"] for r in monitoring.alert_rules()["groups"][0]["rules"]}
    tests = []
    for name, (series, before, after, firing) in CASES.items():
        tests.append({"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                      "alert_rule_test": [{"eval_time": before, "alertname": name, "exp_alerts": []},
                                          {"eval_time": after, "alertname": name,
                                           "exp_alerts": [alert(name, labels, summary) for labels, summary in firing]}]})
    (written / "tests.yml").write_text(yaml.safe_dump({"rule_files": [monitoring.RULES_FILE],
                                                       "evaluation_interval": "30s", "tests": tests}))
    rc, said = run("promtool", "test", "rules", "tests.yml", cwd=written)
    assert rc == 0 and "SUCCESS" in said, said


def test_promtool_test_can_fail(written):
    """The same runner, told the floor alert fires for the healthy rank too, fails: the tests above
    assert something."""
    series, _before, after, firing = CASES["SparkstackMemoryBelowFloor"]
    wrong = firing + [({"cluster": "c", "rank": "0", "host": "spark1"}, "c rank 0 (spark1): MemAvailable 18.63GiB, below the planned floor")]
    test = {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": after, "alertname": "SparkstackMemoryBelowFloor",
                                 "exp_alerts": [alert("SparkstackMemoryBelowFloor", la, su) for la, su in wrong]}]}
    (written / "tests.yml").write_text(yaml.safe_dump({"rule_files": [monitoring.RULES_FILE], "tests": [test]}))
    rc, said = run("promtool", "test", "rules", "tests.yml", cwd=written)
    assert rc != 0 and "FAILED" in said, said


# -- Alertmanager delivers --------------------------------------------------------------------------

class Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 -- http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_alertmanager_delivers_an_alert_to_the_webhook(tmp_path):
    hook = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    Receiver.received = []
    am_port, cluster_port = free_port(), free_port()
    config = monitoring.alertmanager_config(f"http://127.0.0.1:{hook.server_port}/alerts")
    config["route"]["group_wait"] = "1s"  # the test's patience, not the owner's
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    am = subprocess.Popen(["prometheus-alertmanager", f"--config.file={tmp_path / 'alertmanager.yml'}",
                           f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                           f"--cluster.listen-address=127.0.0.1:{cluster_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{am_port}"
        assert wait_ready(url, 30), am.stderr.read1().decode() if am.poll() is not None else "not ready"
        rule = monitoring.alert_rules()["groups"][0]["rules"][1]  # engine down, as Prometheus posts it
        posted = httpx.post(f"{url}/api/v2/alerts", json=[{
            "labels": {"alertname": rule["alert"], "cluster": "sandbox", "rank": "2", "host": "spark3",
                       **rule["labels"]},
            "annotations": {"summary": "sandbox rank 2 (spark3): the engine container is not running"}}], timeout=5)
        assert posted.status_code == 200, posted.text
        deadline = time.monotonic() + 30
        while not Receiver.received and time.monotonic() < deadline:
            time.sleep(0.2)
        assert Receiver.received, "Alertmanager delivered nothing to the webhook"
        path, body = Receiver.received[0]
        assert path == "/alerts" and body["status"] == "firing"
        assert body["groupLabels"] == {"cluster": "sandbox", "alertname": "SparkstackEngineDown"}
        assert body["alerts"][0]["labels"]["host"] == "spark3"
    finally:
        am.terminate()
        am.wait(timeout=10)
        hook.shutdown()


def test_prometheus_scrapes_the_exporter_with_vllms_names(tmp_path):
    """A real Prometheus asks for OpenMetrics, for which prometheus_client's own server escapes
    every ':' in a sample name; the exporter answers in the text format, names kept, so
    vLLM's series are found under the names the rules and the dashboard query. (Samples here are
    recorded ones; tests/test_metrics_sandbox.py scrapes the sandbox while it serves.)"""
    import subprocess as sp

    from test_metrics import VLLM_METRICS, FakeSampling, served_states
    from launcher.apply import exporter
    from launcher.inputs import config

    loaded = config.load(Path(__file__).resolve().parent.parent / "env" / "cluster.example.yaml")
    collector = exporter.ClusterCollector(loaded, FakeSampling(served_states(loaded)),
                                          fetch=VLLM_METRICS.read_text, clock=lambda: 101.5)
    collector.read_engine()
    server = exporter.http_server("127.0.0.1", 0, exporter.registry(collector))
    for name, text in monitoring.files(f"127.0.0.1:{server.server_port}", "127.0.0.1:1", "http://127.0.0.1:9/x",
                                       scrape_interval="1s").items():
        (tmp_path / name).write_text(text)
    port = free_port()
    prom = sp.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                     f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                    stdout=sp.DEVNULL, stderr=sp.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_ready(url, 60)
        deadline, found = time.monotonic() + 30, []
        while not found and time.monotonic() < deadline:
            time.sleep(0.5)
            found = httpx.get(f"{url}/api/v1/query", params={"query": "vllm:num_requests_running"}).json()["data"]["result"]
        assert found and found[0]["metric"]["cluster"] == config.cluster_name(loaded)
        escaped = httpx.get(f"{url}/api/v1/query", params={"query": "vllm_num_requests_running"}).json()["data"]["result"]
        assert escaped == []
    finally:
        prom.terminate()
        prom.wait(timeout=20)
        server.shutdown()
