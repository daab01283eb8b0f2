"""`sparkstack metrics serve`: the cluster in Prometheus' text format, from the control host.

- Per rank (labels cluster, rank, host), from the samplers' streams (sampling.py): memory and the
  planned floor, the engine container, the GPU, every HCA's RoCE data and error counters, the
  memory guard's events, and the sampler's own health.
- vLLM's own /metrics from rank 0, read at each scrape and passed on with `cluster` and `profile`
  labels added (names as vLLM 0.33 writes them: vllm:num_requests_running, ...).
- The supervisor's (`up --keep`) serving flag, restarts and last event, from its event log on
  this host (what it once wrote as a node-exporter textfile).

Written with prometheus_client (the field's library): a collector that reads the newest samples at
each scrape, so a scrape costs no SSH round trip.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from .sampling import RankState, Sampling
from ..errors import SparkstackError
from ..facts.sample import DATA_WORDS, ERROR_COUNTERS, WORD_BYTES
from ..inputs.config import Loaded, cluster_name
from ..transport import api

GIB = 1024 ** 3
ENGINE_TIMEOUT_S = 2.0
RANK = ("cluster", "rank", "host")
GUARD_EVENTS = ("relief", "hard", "killed")  # counted from 0, so a rate exists before the first
_MEMORY = (("total", "total", "MemTotal"), ("available", "available", "MemAvailable"),
           ("free", "free", "MemFree"), ("page_cache", "cached", "Cached"),
           ("swap_total", "swap_total", "SwapTotal"), ("swap_free", "swap_free", "SwapFree"))
_GPU = (("utilization_ratio", "utilization", 0.01, "GPU utilization (nvidia-smi utilization.gpu), 0-1"),
        ("sm_clock_hertz", "sm_clock_mhz", 1e6, "SM clock (nvidia-smi clocks.sm)"),
        ("power_watts", "power_w", 1.0, "board power draw (nvidia-smi power.draw)"),
        ("temperature_celsius", "temperature_c", 1.0, "GPU temperature (nvidia-smi temperature.gpu)"))


def supervisor_state(lines: list[str]) -> dict | None:
    """The supervisor's current run, folded from its JSON-lines log as its EventLog counts it:
    serving (0/1), restarts, the last event's unix time. None without a run."""
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    started = max((i for i, e in enumerate(events) if e["event"] == "started"), default=None)
    if started is None:
        return None
    serving, restarts, last = False, 0, None
    for e in events[started:]:
        restarts += e["event"] == "restart"
        serving = e["event"] == "serving" or (serving and e["event"] not in ("failure", "gave up", "up failed"))
        last = e.get("at", last)
    at = datetime.fromisoformat(last).timestamp() if isinstance(last, str) else 0.0
    return {"serving": int(serving), "restarts": restarts, "last_event_at": at}


class ClusterCollector:
    """prometheus_client's collector interface: `collect()` yields the families at each scrape."""

    def __init__(self, loaded: Loaded, sampling: Sampling, supervisor_log: Path | None = None,
                 fetch=None, clock=time.monotonic):
        self.loaded, self.sampling, self.supervisor_log, self.clock = loaded, sampling, supervisor_log, clock
        self.cluster = cluster_name(loaded)
        self.floor = int(loaded.cluster.overrides.free_floor_gib * GIB)
        endpoint = api.endpoint(loaded)
        self.fetch = fetch or (lambda: engine_metrics_text(endpoint))
        self._engine_families: list[Metric] | None = None  # rank 0's, relabelled; None: not answering

    def collect(self):
        yield from self._ranks(self.sampling.snapshot())
        yield from self._engine()
        yield from self._supervisor()

    def read_engine(self) -> None:
        """Read rank 0's /metrics and keep it relabelled for the scrapes to come: `serve` calls this
        once an interval in a thread of its own, so a scrape neither waits on the network nor parses
        vLLM's text again."""
        try:
            families = list(relabel(self.fetch(), {"cluster": self.cluster, "profile": self.loaded.profile.name}))
        except Exception:  # noqa: BLE001 -- an engine that is down is a value of sparkstack_engine_metrics_up
            families = None
        self._engine_families = families

    def keep_reading_engine(self, interval: float, stop: threading.Event) -> None:
        while True:
            self.read_engine()
            if stop.wait(interval):
                return

    # -- the ranks ----------------------------------------------------------------------------------
    def _ranks(self, states: list[RankState]):
        now = self.clock()
        fam = _Families(self.cluster)
        stale = 3 * self.sampling.interval + 2
        for s in states:
            key = (str(s.rank), s.host)
            age = s.age(now)
            fam.gauge("sampler_up", "1 while the rank's sampler delivers (a sample within 3 intervals)",
                      key, int(age is not None and age <= stale))
            fam.counter("ssh_sessions_opened", "SSH channels opened to run the rank's sampler", key,
                        s.sessions_opened)
            fam.gauge("memory_floor_bytes", "the free memory the plan keeps while serving "
                      "(overrides.free_floor_gib)", key, self.floor)
            if s.sample is None:
                continue
            fam.gauge("sample_age_seconds", "seconds since the rank's newest sample arrived", key, age)
            fam.counter("sampler_cpu_seconds", "CPU seconds the rank's sampler used", key, s.sample.cpu_s)
            self._memory(fam, key, s)
            self._engine_container(fam, key, s)
            self._gpu(fam, key, s)
            self._fabric(fam, key, s)
            for event, n in sorted({**dict.fromkeys(GUARD_EVENTS, 0), **s.guard_counts}.items()):
                fam.counter("guard_events", "the memory guard's events on the rank since the exporter "
                            "started, by kind (relief: caches dropped; hard: engine stopped)", key, n,
                            event=event)
        return fam.all()

    @staticmethod
    def _memory(fam, key, s: RankState) -> None:
        if s.sample.memory is None:
            return
        for name, field, meminfo in _MEMORY:
            fam.gauge(f"memory_{name}_bytes", f"/proc/meminfo {meminfo}", key, getattr(s.sample.memory, field))

    @staticmethod
    def _engine_container(fam, key, s: RankState) -> None:
        engine = s.sample.engine
        fam.gauge("engine_running", "1 while the rank's engine container runs", key, int(engine.running))
        fam.gauge("engine_state", "the engine container's Docker state (the series with value 1)", key, 1,
                  state=engine.state)
        if engine.memory is not None:
            fam.gauge("engine_memory_bytes", "the engine container's memory (cgroup usage less inactive "
                      "file pages, as docker stats shows)", key, engine.memory)

    @staticmethod
    def _gpu(fam, key, s: RankState) -> None:
        gpu = s.sample.gpu
        fam.gauge("gpu_measured", "1 where nvidia-smi reports the GPU (0: not measured)", key,
                  int(gpu.not_measured is None))
        for name, field, scale, what in _GPU:
            value = getattr(gpu, field)
            if value is not None:
                fam.gauge(f"gpu_{name}", what, key, value * scale)

    @staticmethod
    def _fabric(fam, key, s: RankState) -> None:
        for hca, counters in s.sample.fabric.items():
            for name, direction in zip(DATA_WORDS, ("transmit", "receive")):
                if name in counters:
                    fam.counter(f"fabric_{direction}_bytes", f"RoCE bytes the HCA {direction}ted "
                                f"({name} x {WORD_BYTES}: the counter counts 4-byte words)", key,
                                counters[name] * WORD_BYTES, hca=hca)
            for name in ERROR_COUNTERS:
                if name in counters:
                    fam.counter("fabric_errors", "the HCA's error and retry counters (ports/1/counters, "
                                "hw_counters)", key, counters[name], hca=hca, counter=name)

    # -- rank 0's vLLM ------------------------------------------------------------------------------
    def _engine(self):
        families = self._engine_families
        up = GaugeMetricFamily("sparkstack_engine_metrics_up", "1 when rank 0's /metrics answered its last read",
                               labels=["cluster", "profile"])
        up.add_metric([self.cluster, self.loaded.profile.name], int(families is not None))
        yield up
        yield from families or ()

    # -- the supervisor -----------------------------------------------------------------------------
    def _supervisor(self):
        if self.supervisor_log is None or not self.supervisor_log.exists():
            return
        state = supervisor_state(self.supervisor_log.read_text().splitlines())
        if state is None:
            return
        for name, kind, what in (("serving", GaugeMetricFamily, "1 while the supervisor finds the cluster serving"),
                                 ("restarts", CounterMetricFamily, "re-deploys by the supervisor since it started"),
                                 ("last_event_timestamp_seconds", GaugeMetricFamily, "when the supervisor last logged")):
            family = kind(f"sparkstack_{name}", what, labels=["cluster"])
            family.add_metric([self.cluster], state[{"last_event_timestamp_seconds": "last_event_at"}.get(name, name)])
            yield family


def engine_metrics_text(endpoint: api.Endpoint) -> str:
    """Rank 0's /metrics as vLLM serves it; httpx's error when it does not answer 200."""
    r = httpx.get(f"{endpoint.url}/metrics", headers=endpoint.headers, timeout=ENGINE_TIMEOUT_S)
    r.raise_for_status()
    return r.text


def relabel(text: str, labels: dict[str, str]):
    """The families of a Prometheus text, every sample with `labels` added."""
    for family in text_string_to_metric_families(text):
        out = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            out.add_sample(sample.name, {**sample.labels, **labels}, sample.value, sample.timestamp)
        yield out


class _Families:
    """Families by name, filled rank by rank: `sparkstack_<name>`, labels cluster, rank, host and
    any extra ones."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.families: dict[str, Metric] = {}

    def _add(self, kind, name: str, what: str, key: tuple[str, str], value, extra: dict) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = kind(f"sparkstack_{name}", what, labels=[*RANK, *extra])
        family.add_metric([self.cluster, *key, *extra.values()], value)

    def gauge(self, name, what, key, value, **extra) -> None:
        self._add(GaugeMetricFamily, name, what, key, value, extra)

    def counter(self, name, what, key, value, **extra) -> None:
        self._add(CounterMetricFamily, name, what, key, value, extra)

    def all(self):
        return list(self.families.values())


def registry(collector: ClusterCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def http_server(host: str, port: int, reg: CollectorRegistry) -> ThreadingHTTPServer:
    """GET /metrics in Prometheus' text format 0.0.4, names as written (vllm:...), in a thread.
    Not prometheus_client's own server: for a scraper that asks for OpenMetrics it escapes every
    sample name's ':' to '_' (0.26: `escaping=underscores`), and vLLM's names would then differ
    from what its dashboards and the alert rules query."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics here")
                return
            body = generate_latest(reg, escaping=ALLOWUTF8)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics http").start()
    return server


def parse_listen(listen: str) -> tuple[str, int]:
    """"HOST:PORT" (IPv6 in brackets; port 0: one the system picks) -> (host, port); ValueError
    saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    return host.strip("[]") or "127.0.0.1", int(port)


DEFAULT_PORT = 9433


def serve(loaded: Loaded, group, listen: str, interval: float, supervisor_log: Path | None,
          say=print, ready=None, stop: threading.Event | None = None) -> None:
    """Sample every rank and answer scrapes on `listen` until Ctrl+C (or `stop` is set);
    `ready(sampling, port)` is called once it answers (tests, the benchmark)."""
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise SparkstackError(str(e)) from None
    stop = stop or threading.Event()
    sampling = Sampling(loaded, group, interval)
    collector = ClusterCollector(loaded, sampling, supervisor_log)
    try:  # before anything connects to a rank
        server = http_server(host, port, registry(collector))
    except OSError as e:
        raise SparkstackError(f"cannot listen on {host}:{port} ({e.strerror or e}); "
                              "pick another with --listen HOST:PORT") from None
    try:
        with sampling:
            threading.Thread(target=collector.keep_reading_engine, args=(interval, stop), daemon=True,
                             name="rank 0 /metrics").start()
            say(f"serving metrics of {len(group.connections)} ranks at http://{host}:{server.server_port}/metrics "
                f"(a sample every {interval:g} s per rank, one SSH channel each); Ctrl+C stops")
            if ready is not None:
                ready(sampling, server.server_port)
            while not stop.wait(3600):
                pass
    except KeyboardInterrupt:
        say("stopped serving metrics")
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
