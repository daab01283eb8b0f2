"""`check --bandwidth` run: every rank's NCCL all-reduce job at once in the serving image, over the
open Group, then judged (launcher/check/bandwidth.py holds the jobs' commands, the outcome parser
and the verdict, all pure)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from ..check.bandwidth import PORT, Job, Outcome, commands, judge, outcome, preconditions, rank_envs, stop_command
from ..facts.record import Facts
from ..inputs.config import Loaded
from ..plan import cluster_plan as plan_mod
from ..status import Finding

STOP_GRACE_S = 3.0  # see measure


def measure(group, jobs: dict[int, Job]) -> dict[int, Outcome]:
    """Every rank's job at once over the open Group (an all-reduce needs them all running). Once
    a rank cannot take part, the others' containers are stopped (after STOP_GRACE_S, in which a
    rank failing the same way reports it itself) so they do not wait out the rendezvous timeout;
    a run cut off by the SSH timeout has its container removed."""
    import threading
    from concurrent.futures import TimeoutError as Pending

    conns = {c.target.rank: c for c in group.connections if c.target.rank in jobs}
    outcomes: dict[int, Outcome] = {}
    stops: list[threading.Thread] = []

    def stop_unless_done(r, future) -> None:
        try:
            future.result(timeout=STOP_GRACE_S)
        except Pending:
            conns[r].run(stop_command(), timeout=30)

    with ThreadPoolExecutor(max_workers=max(1, len(conns))) as pool:
        futures = {r: pool.submit(conns[r].run, jobs[r].command, stdin=jobs[r].stdin,
                                  timeout=jobs[r].timeout) for r in conns}
        for future in as_completed(futures.values()):
            r = next(k for k, f in futures.items() if f is future)
            res = future.result()
            outcomes[r] = outcome(r, res.exit_status, res.stdout, res.stderr, res.error)
            if outcomes[r].causes_others and not stops:
                for other, f in futures.items():
                    if other != r:
                        t = threading.Thread(target=stop_unless_done, args=(other, f), daemon=True)
                        t.start()
                        stops.append(t)
    for t in stops:
        t.join(STOP_GRACE_S + 35)
    if any(o.kind == "broken" for o in outcomes.values()):
        for c in conns.values():
            c.run(stop_command(), timeout=30)
    return outcomes


@dataclass
class Measured:
    findings: dict[int, Finding]
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)


def check(loaded: Loaded, group, *, image: str | None, facts: dict[int, Facts],
          image_error: str | None = None, port: int = PORT, args: dict | None = None) -> Measured:
    """What `check --bandwidth` adds: one finding per answering rank."""
    early = preconditions(loaded, image, facts, image_error)
    if early is not None:
        return Measured(early)
    envs, notes = rank_envs(loaded, facts)
    master = plan_mod.rendezvous(loaded, envs)
    jobs = commands(loaded, image, envs, master=master, port=port, args=args)
    outcomes = measure(group, jobs)
    return Measured(judge(outcomes, image=image, master=master, port=port, notes=notes), outcomes, jobs)
