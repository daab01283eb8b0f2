"""`sparkstack up`: the whole (re-)deploy, and with --keep the supervisor after it."""

from __future__ import annotations

import json

import click

from .console import err, out
from .shared import json_option, lock_option, trust_option, with_cluster


@click.command()
@with_cluster(profile=True)
@json_option
@trust_option()
@lock_option
@click.option("--restart", is_flag=True, help="start again even if already running as planned")
@click.option("--keep", is_flag=True,
              help="then keep it serving: watch every rank and the API, re-deploy on a failure (keep: in the config)")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="seconds to wait for the API once started (longer when the slowest rank's cold-load estimate x 2 is; see `check`'s load row)")
@click.option("--no-verify", is_flag=True,
              help="skip the quick verification once the API answers (perplexity on the kit's held-out "
                   "texts and greedy probes, alone and crowded; `sparkstack verify`): on purpose only")
def up(loaded, as_json, trust_new_hosts, wait_lock, restart, keep, wait_timeout, no_verify):
    """The whole (re-)deploy, e.g. after a boot: prepare the nodes, check every rank, build and
    ship only what a rank lacks, start TP vLLM (workers, then the head), wait for the API.

    \b
    While the engines load, a watcher on every rank drops page caches below the soft floor
    of MemFree and stops the cluster below the hard floor of MemAvailable (memory_guard in
    the config); `up` prints each rank's lowest MemAvailable (--json: the whole timeline).
    Once the API answers, a guard on every rank itself takes over for as long as that rank's
    engine runs, with or without this host: it drops caches below memory_guard.serving's soft
    floor and stops that rank's engine below its hard floor (`status`, `logs --guard`).
    A failed check starts nothing. If any rank fails to start, every rank is stopped and each
    failed rank is shown with its exit code and last log lines. A failure also says what changed
    on a rank since the last good start (link, MTU, address, GID index, driver, image,
    MemAvailable: kept on this host each time `up` gets the cluster serving; --json: on stdout
    too). A cluster already running as planned is left alone: `up` then changes nothing (use
    --restart to force).
    Once the API answers, the quick form of `sparkstack verify` runs: a model that answers wrong
    (perplexity beyond its baseline or the sane bound, a probe wrong alone or crowded) is not
    serving: every rank is stopped and the figures and the fix said (--no-verify skips it).
    Ctrl+C, SIGTERM or SIGHUP: the containers this run started are stopped (exit 130); a
    second one exits without waiting for that.
    --keep: after that, watch every rank's container and the API (keep.check_interval_s); on a
    failure, re-deploy on every rank after a backoff (keep.backoff_s, doubling), and give up with
    every rank stopped after keep.max_restarts_per_hour, or when a rank's memory does not come
    back (memory_guard.serving.memory_back_s). Events go to a log `status` reads (each failure's
    cause with what changed since the last good start); `sparkstack metrics serve` exports them.
    Ctrl+C/SIGTERM while watching leaves the cluster serving.
    """
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if keep:
        return _keep(loaded, trust_new_hosts, wait_lock, wait_timeout, say, no_verify)
    from ..gather.ahead import Ahead
    from ..transport.remote import Group

    with Group.for_cluster(loaded.cluster, trust_new=trust_new_hosts, say=say) as group:  # as deploy.group_for
        ahead = Ahead(loaded, group)  # read-only, under way while the rest is imported and the lock taken
        from ..apply import cluster_lock

        with cluster_lock.held(loaded, group, wait_lock, say) as lock:
            report = _up_held(loaded, group, as_json, restart, wait_timeout, say, no_verify,
                              None if lock.waited else ahead)
    from ..transport import api

    ep = api.endpoint(loaded)
    for memory in report.memory:
        say("  memory while loading: " + memory.summary())
    if as_json:
        click.echo(json.dumps({"serving": loaded.profile.name, "url": ep.url, **report.to_json()}, indent=2))
        return
    out.print(f"serving {loaded.profile.name} at {ep.url} "
              f"({'started' if report.changed else 'unchanged'}, {report.seconds:.1f} s)")
    _say_how_to_authenticate(loaded)


def _up_held(loaded, group, as_json, restart, wait_timeout, say, no_verify, ahead):
    from ..apply import deploy, verify as verifying
    from ..errors import SparkstackError

    try:
        return deploy.up(loaded, group, restart=restart, wait_timeout=wait_timeout, say=say,
                         verify=verifying.chosen(no_verify), ahead=ahead)
    except SparkstackError as e:
        if as_json and getattr(e, "since", None):  # what changed since the last good start, for scripts
            click.echo(json.dumps({"error": e.message, "since_last_good_start": e.since.to_json()}, indent=2))
        raise


def _keep(loaded, trust_new_hosts, wait_lock, wait_timeout, say, no_verify) -> None:
    from ..apply import cluster_lock, deploy, supervisor, verify as verifying

    log = supervisor.EventLog(supervisor.log_path(loaded))
    say(f"supervising {loaded.profile.name}: events in {log.path} (`sparkstack metrics serve` exports them)")
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        supervisor.Supervisor(loaded, group, log, wait_timeout, say,
                              verify=verifying.chosen(no_verify)).run()


def _say_how_to_authenticate(loaded) -> None:
    from ..inputs import apikey

    key = apikey.resolve(loaded)
    if key.warning:
        err.print(f"[yellow]WARN[/] {key.warning}")
    else:
        err.print("clients send `Authorization: Bearer KEY`; `sparkstack api-key` prints KEY", markup=False)
