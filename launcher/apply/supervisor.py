"""`up --keep`: bring the cluster up, then keep it serving.

In TP4 one dead rank (an engine crash, a rank rebooted, an NCCL timeout) leaves the API hung or
dead. The supervisor checks every rank's container and the API every `keep.check_interval_s`, and
the engine's token progress (launcher/apply/liveness.py: a wedged engine still answers /health);
on a failure it re-deploys all or nothing (down on every rank, wait for memory, up) after a
backoff that doubles up to `keep.backoff_max_s`, and gives up -- every rank stopped, the rank and
cause named -- after `keep.max_restarts_per_hour`, or at once when a rank's memory does not come
back after the stop (memory_guard.serving.memory_back_s): re-deploying onto a leak would loop.
Each rank's memory guard (servguard.py) runs on the rank itself; the supervisor logs its events
and, when the guard stopped an engine, names the rank, the floor and the figures in the cause.
Every event goes to a JSON-lines log (`status` shows the restarts and the last cause;
`sparkstack metrics serve` exports them).
SIGTERM or Ctrl+C while it watches: it stops watching and leaves the cluster serving.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import deploy, last_good, liveness, prep, serve, servguard
from .cluster_lock import LockLost, ensure_held
from ..errors import Interrupted, SparkstackError
from ..inputs import apikey
from ..inputs.config import Loaded
from ..transport import api
from ..transport.remote import Group

HOUR_S = 3600


class GaveUp(SparkstackError):
    pass


def log_dir() -> Path:
    return apikey.state_dir() / "keep"


def log_path(loaded: Loaded) -> Path:
    """One log per cluster (named by rank 0's address, as the API key is)."""
    return log_dir() / (re.sub(r"[^A-Za-z0-9._-]", "_", loaded.cluster.ranks[0].address) + ".jsonl")


@dataclass
class EventLog:
    """Events as JSON lines."""

    path: Path
    last_cause: str | None = None

    def add(self, kind: str, **fields) -> dict:
        now = time.time()
        event = {"at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
                 "event": kind, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")
        self.last_cause = fields.get("cause", self.last_cause)
        return event


def summary(path: Path) -> dict | None:
    """What `status` shows: restarts and the last cause, from the log; None without one."""
    if not path.exists():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    started = max((i for i, e in enumerate(events) if e["event"] == "started"), default=0)
    current = events[started:]  # this supervisor's run
    causes = [e for e in current if e.get("cause")]
    return {"restarts": sum(e["event"] == "restart" for e in current),
            "last_event": current[-1] if current else None,
            "last_cause": causes[-1]["cause"] if causes else None,
            "last_cause_at": causes[-1]["at"] if causes else None, "log": str(path)}


def _liveness_note(s) -> str:
    if not s.enabled:
        return "; liveness from token progress off (keep.liveness.enabled)"
    return (f", and token progress every {s.interval_s:g} s after {s.grace_s:g} s: "
            f"{s.stalled_checks} stalled checks in a row are a wedge")


@dataclass
class Supervisor:
    loaded: Loaded
    group: Group
    log: EventLog
    wait_timeout: float = 900
    say: object = print
    sleep: object = time.sleep
    restarts: list[float] = field(default_factory=list)  # monotonic times, within the hour
    verify: object = None  # deploy.up's verify for each (re-)deploy: `up --keep` passes up's own

    @property
    def settings(self):
        return self.loaded.cluster.keep

    def run(self) -> None:
        """Never returns: raises GaveUp, or Interrupted when told to stop."""
        self.log.add("started", profile=self.loaded.profile.name)
        backoff = self.settings.backoff_s
        restart = False
        while True:
            try:
                deploy.up(self.loaded, self.group, restart=restart, wait_timeout=self.wait_timeout, say=self.say,
                          verify=self.verify)
                self.log.add("serving")
                self.say("serving; watching every rank and the API "
                         f"(every {self.settings.check_interval_s:g} s){_liveness_note(self.settings.liveness)}")
                backoff = self.settings.backoff_s
                cause = last_good.said(self._watch(), last_good.explain(self.loaded, self.group))
                self.log.add("failure", cause=cause)
            except (Interrupted, LockLost):
                raise
            except SparkstackError as e:
                cause = e.message
                self.log.add("up failed", cause=cause)
            self.say(f"failure: {cause}")
            self._count_or_give_up(cause)
            self.say(f"re-deploying on every rank in {backoff:g} s "
                     f"(restart {len(self.restarts)} of at most {self.settings.max_restarts_per_hour} an hour)")
            self._pause(backoff)
            backoff = min(backoff * 2, self.settings.backoff_max_s)
            self.log.add("restart", attempt=len(self.restarts))
            ensure_held()  # another operator's cluster now, if its lock lapsed: not ours to re-deploy
            self._down_until_memory_back()
            restart = True

    def _down_until_memory_back(self) -> None:
        """All or nothing: every rank stopped, then every rank's MemAvailable back to the plan's
        figure within memory_guard.serving.memory_back_s. A rank that keeps its memory (a leak
        the engine's exit did not free) stays out: re-deploying onto it would loop (issue 29)."""
        wait = self.loaded.cluster.memory_guard.serving.memory_back_s
        try:
            deploy.down(self.loaded, self.group, say=self.say, wait_timeout=wait)
        except prep.PrepError as e:
            cause = "a rank did not give its memory back after its engine stopped; " + e.message
            self.log.add("gave up", cause=cause)
            raise GaveUp(f"giving up: {cause}\nevery rank's engine is stopped; fix that rank (a reboot "
                         "frees what a dead engine leaked), then `sparkstack up --keep` again") from None

    def _say_guard_events(self, feed: servguard.EventFeed) -> None:
        """Each rank's memory guard events since the last look: said and logged."""
        for host, event in feed.new():
            self.say(f"{host}: {servguard.describe(event)}")
            self.log.add("memory guard", rank=host, guard_event=event["event"],
                         detail=servguard.describe(event),
                         **{k: event[k] for k in ("avail", "free") if k in event})

    def _count_or_give_up(self, cause: str) -> None:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < HOUR_S]
        if len(self.restarts) >= self.settings.max_restarts_per_hour:
            stopped = serve.stop_and_say(self.group)
            self.log.add("gave up", cause=cause)
            raise GaveUp(f"giving up: {len(self.restarts)} restarts in the last hour and it failed again "
                         f"({cause}); {stopped}. Fix the cause and run `sparkstack up --keep` again")
        self.restarts.append(now)

    def _pause(self, seconds: float) -> None:
        try:
            self.sleep(seconds)
        except KeyboardInterrupt:
            raise Interrupted("stopped supervising before the re-deploy; "
                              f"{serve.stop_and_say(self.group)}") from None

    def _watch(self) -> str:
        """Until something fails: the cause, naming the rank where there is one."""
        misses, last = 0, ""
        endpoint = api.endpoint(self.loaded)
        live = liveness.Watch(endpoint, self.settings.liveness) if self.settings.liveness.enabled else None
        busy = False
        guard = servguard.EventFeed(self.group, self.loaded.cluster.memory_guard.serving)
        guard.new()  # what the ranks' guards recorded before this start is not news
        try:
            while True:
                self.sleep(self.settings.check_interval_s)
                self._say_guard_events(guard)
                dead = [s for s in serve.states(self.group) if s.state != "running"]
                if dead:
                    return "; ".join(servguard.diagnose(self.group, s, guard.settings) for s in dead)
                ok, last = api.health_check(endpoint, timeout=10)
                misses = 0 if ok else misses + 1
                if misses >= self.settings.api_failures:
                    return (f"the API at {endpoint.url} did not answer {misses} checks in a row ({last}); "
                            "every rank's container still runs")
                if ok and live and live.due():
                    wedged, busy = self._judge_liveness(live, busy)
                    if wedged:
                        return wedged
        except KeyboardInterrupt:
            self.log.add("stopped")
            raise Interrupted("stopped supervising; the cluster keeps serving "
                              "(`sparkstack down` stops it)") from None

    def _judge_liveness(self, live: liveness.Watch, was_busy: bool) -> tuple[str | None, bool]:
        """One look at rank 0's token progress: the cause when wedged; whether it is busy now
        (a probe waiting behind real load, logged once per busy spell, never counted)."""
        verdict = live.look()
        if verdict.state == "wedged":
            rank0 = self.loaded.cluster.ranks[0]
            return f"rank 0 ({rank0.label}): wedged: {verdict.why}", False
        if verdict.state == "busy" and not was_busy:
            self.log.add("busy", detail=verdict.why)
            self.say(f"busy, not wedged: {verdict.why}")
        return None, verdict.state == "busy"
