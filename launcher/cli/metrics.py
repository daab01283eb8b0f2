"""`sparkstack metrics`: the cluster for Prometheus (`serve`), and the files an owner's
Prometheus, Alertmanager and Grafana need to use it (`write-config`)."""

from __future__ import annotations

from pathlib import Path

import click

from .console import out
from .shared import trust_option, with_cluster


@click.group()
def metrics():
    """The cluster in Prometheus' format: every rank's memory (against the planned floor), engine
    container, GPU and RoCE counters, the memory guard's events, vLLM's own metrics from rank 0 and
    the supervisor's restarts; and the Prometheus, alert, Alertmanager and Grafana files for it."""


@metrics.command("serve")
@with_cluster(interrupted="stopped serving metrics")
@click.option("--listen", default="127.0.0.1:9433", show_default=True, metavar="HOST:PORT",
              help="where Prometheus scrapes /metrics (loopback by default: put 0.0.0.0:9433 only "
                   "where the network is yours)")
@click.option("--interval", type=click.FloatRange(min=0.2, max=60), default=1.0, show_default=True,
              metavar="SECONDS", help="how often each rank's sampler reports")
@trust_option()
def serve(loaded, listen, interval, trust_new_hosts):
    """Sample every rank over ONE SSH channel each (a small stdlib sampler streams a line per
    interval; no SSH session per scrape) and answer Prometheus' scrapes until Ctrl+C."""
    from ..apply import deploy, exporter, supervisor

    with deploy.group_for(loaded, trust_new_hosts, lambda line: out.print(line, markup=False)) as group:
        exporter.serve(loaded, group, listen, interval, supervisor.log_path(loaded),
                       say=lambda line: out.print(line, markup=False))


@metrics.command("write-config")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--exporter", default="127.0.0.1:9433", show_default=True, metavar="HOST:PORT",
              help="where Prometheus finds `sparkstack metrics serve`")
@click.option("--alertmanager", default="127.0.0.1:9093", show_default=True, metavar="HOST:PORT",
              help="where Prometheus sends alerts")
@click.option("--webhook", default="http://127.0.0.1:5001/alerts", show_default=True, metavar="URL",
              help="where Alertmanager posts every alert (a chat's or pager's incoming webhook)")
@click.option("--scrape-interval", default="5s", show_default=True, metavar="DURATION")
@click.option("--acceptance-floor", type=click.FloatRange(min=1), default=None, metavar="TOKENS",
              help="accepted tokens per step under which to alert (default: the recipe's 1.8, seed 000)")
def write_config(directory, exporter, alertmanager, webhook, scrape_interval, acceptance_floor):
    """Write prometheus.yml, the alert rules, alertmanager.yml and a Grafana dashboard into
    DIRECTORY. Then: `prometheus --config.file=DIRECTORY/prometheus.yml`, `prometheus-alertmanager
    --config.file=DIRECTORY/alertmanager.yml`, and import the dashboard JSON in Grafana."""
    from ..plan import monitoring

    floor = monitoring.ACCEPTANCE_FLOOR if acceptance_floor is None else acceptance_floor
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in monitoring.files(exporter, alertmanager, webhook, scrape_interval, floor).items():
        (directory / name).write_text(text)
        out.print(f"wrote {directory / name}", markup=False)
