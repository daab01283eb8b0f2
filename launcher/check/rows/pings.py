"""The ping rows: the peers' fabric IPs answer (peers), at 9000 B with don't-fragment (jumbo).

A ring is judged as a whole: TP across it needs every link, so a link (rank r to rank r+1, in
the config's order, which must be the cable order) that does not answer both ways fails on BOTH
ends, each naming the other. The ranks beyond the neighbours are not pinged: nothing talks across
a ring (the sockets use the management network).
"""

from __future__ import annotations

from ...facts import fabric
from ...facts.record import Facts
from ...gather.extras import PingAnswer, PingTarget
from ...status import Status
from . import row
from .case import Case, RankReport


@row("peers", order=190, reads=("targets", "extras"))
def _check_peers(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    _pings(inp, r, rr, df=False)


@row("jumbo", order=200, reads=("targets", "extras"))
def _check_jumbo(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    _pings(inp, r, rr, df=True)


def _pings(inp: Case, r: int, rr: RankReport, df: bool) -> None:
    name = "jumbo" if df else "peers"
    targets = [t for t in inp.targets.get(r, []) if not df or t.df_size]
    extra = inp.extras.get(r)
    ring = inp.loaded.cluster.topology == "ring"
    if df and inp.targets.get(r) and not targets:
        rr.add(name, Status.PASS, f"not measured: the fabric MTU is not {fabric.JUMBO_MTU}")
        return
    if not targets and not ring:  # a ring's links are judged from both ends: its neighbours' pings
        rr.add(name, Status.WARN if not df else Status.PASS, "not measured: no peer fabric IPs",
               "list every rank's fabric_ips in cluster.yaml")
        return
    if extra is None or extra.error:
        rr.add(name, Status.FAIL, f"not measured: {extra.error if extra else 'no answer'}", "re-run check")
        return
    if extra.ping_missing:
        rr.add(name, Status.WARN, "not measured: no `ping` on the rank", "apt install iputils-ping")
        return
    if ring:
        _ring_links(inp, r, rr, df)
        return
    bad, good = [], []
    for t in targets:
        answer = _answer(inp, r, t, df)
        (good if answer.ok else bad).append(_label(t, df) + ("" if answer.ok else f": {answer.detail or 'no reply'}"))
    ok = f"{len(good)}/{len(targets)} answer"
    if bad:
        fix = ("a path in between fragments or drops jumbo frames: same MTU on both ends and the "
               "switch" if df else "check the cable/switch port and the peer's address (`ip addr`)")
        rr.add(name, Status.FAIL, f"{ok}; unreachable: " + "; ".join(bad), fix)
    else:
        rr.add(name, Status.PASS, f"{ok}: " + ", ".join(good))


def _answer(inp: Case, r: int, t: PingTarget, df: bool) -> PingAnswer:
    return inp.extras[r].pings.get((t.ip, df), PingAnswer(False, "no result"))


def _label(t: PingTarget, df: bool) -> str:
    return f"rank {t.peer if t.peer >= 0 else '?'} {t.ip}" + (f" ({t.df_size + 28} B DF)" if df else "")


def _ring_links(inp: Case, r: int, rr: RankReport, df: bool) -> None:
    """Rank r's two ring links (to r-1 and r+1), each judged from both ends' pings: a link that
    does not answer both ways fails here and, by the same rule, on the other end too."""
    name = "jumbo" if df else "peers"
    n = len(inp.loaded.cluster.ranks)
    neighbours = sorted({(r - 1) % n, (r + 1) % n} - {r})
    good, bad, unjudged = [], [], []
    for p in neighbours:
        if p not in inp.facts:
            unjudged.append(f"rank {p} did not answer")
            continue
        answers = _link_answers(inp, r, p, df) + _link_answers(inp, p, r, df)
        failed = [f"rank {a} → {_label(t, df)}: {got.detail or 'no reply'}" for a, t, got in answers if not got.ok]
        if not answers:
            elsewhere = [_label(t, df) for t in inp.targets.get(r, []) if t.peer not in neighbours]
            failed = [f"no addressed cable between rank {r} and rank {p} found"
                      + (f" (this rank's cables end at {', '.join(elsewhere)})" if elsewhere else "")]
        if failed:
            bad.append(f"ring link to rank {p} unreachable: " + "; ".join(failed))
        else:
            good += [_label(t, df) for _, t, _ in _link_answers(inp, r, p, df)]
    if bad:
        fix = ("a link drops 9000 B frames: mtu 9000 on both ends of its cable (netplan)" if df else
               "check the cable between the two ranks and both ends' addresses (`ip addr`); list the "
               "ranks in cable order (each rank cabled to the next, the last to the first)")
        rr.add(name, Status.FAIL, "TP needs every link of the ring: " + " | ".join(bad + unjudged), fix)
    elif unjudged:
        rr.add(name, Status.WARN, f"links up: {', '.join(good) or 'none'}; not judged: " + ", ".join(unjudged),
               "see that rank's ssh row")
    else:
        rr.add(name, Status.PASS, "ring links answer both ways: " + ", ".join(good))


def _link_answers(inp: Case, a: int, b: int, df: bool) -> list[tuple[int, PingTarget, PingAnswer]]:
    """What rank a's pings to rank b's end of their cables got (none when a's were not measured)."""
    extra = inp.extras.get(a)
    if extra is None or extra.error or extra.ping_missing:
        return []
    return [(a, t, _answer(inp, a, t, df)) for t in inp.targets.get(a, []) if t.peer == b and (not df or t.df_size)]
