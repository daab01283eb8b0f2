"""The whole `sparkstack check`: connect, gather (launcher/gather/), plan, ask rank 0's serving
image (the engine config row), judge (launcher/check/report.evaluate), and on request the
measurements that are rows of their own: the NCCL all-reduce (launcher/apply/bandwidth.py, judged
by launcher/check/bandwidth.py) and the checkpoint's hashes (read by launcher/gather/hashes.py,
judged by launcher/check/hashes.py), over the same open Group. Here, not in check/, because it
connects and runs on the ranks: check/ only judges.
"""

from __future__ import annotations

import time

from ..check.report import Report, evaluate
from ..gather import cluster, probe
from ..gather.value import Gathered
from ..inputs.config import Loaded


def add_bandwidth(report: Report, inp: Gathered, group) -> None:
    """`check --bandwidth`: one more row per rank that answered, an NCCL all-reduce across all
    ranks in the serving image (launcher/apply/bandwidth.py), over the same open Group."""
    from . import bandwidth

    found = bandwidth.check(inp.loaded, group, image=inp.known_image, facts=inp.facts,
                            image_error=inp.image_error).findings
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add(f.name, f.status, f.value, f.fix)


def add_hashes(report: Report, inp: Gathered, group) -> None:
    """`check --deep`: every rank hashes its checkpoint files (launcher/gather/hashes.py), judged
    against the manifest (launcher/check/hashes.py)."""
    found = verify(inp.loaded, group, inp.facts)
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add(f.name, f.status, f.value, f.fix)


def verify(loaded: Loaded, group, facts) -> dict:
    """Every rank's `check --deep` finding: read on the ranks, judged against the manifest."""
    from ..check import hashes as judged
    from ..gather import hashes

    return judged.judge(hashes.read(loaded, group, facts), facts)


def plan_or_none(inp: Gathered):
    """The plan made from `inp`, or None when it refuses (the rows say why)."""
    from ..errors import SparkstackError
    from ..plan import cluster_plan as planning

    if inp.model is None:
        return None
    try:
        return planning.build(inp.loaded, inp)
    except SparkstackError:
        return None


def ask_engine(inp: Gathered, group, the_plan) -> None:
    """The engine config row's question (launcher/gather/engine_config.py): rank 0's planned argv
    to the serving image's own engine, when there is a plan and rank 0 has the image; the answer
    (or why it was not asked) goes into `inp`."""
    if the_plan is None:
        inp.engine_unasked = "the plan refuses or cannot be made (see the rows above and `sparkstack plan`)"
        return
    f0 = inp.facts.get(0)
    if f0 is None or f0.docker is None or f0.docker.image(the_plan.image) is None:
        inp.engine_unasked = f"{the_plan.image} is not on rank 0 yet (sparkstack ship; `up` asks after shipping)"
        return
    if f0.checkpoint is None or not f0.checkpoint.config_sha256:
        # the question bind-mounts the checkpoint's directory: Docker would make a missing one, as
        # root, where `stage` then cannot write
        inp.engine_unasked = (f"the checkpoint is not in place on rank 0 ({inp.loaded.cluster.model.serving_path}): "
                              "see the checkpoint row (and staged, with model.local_path)")
        return
    inp.engine_answer = ask_rank0(group, the_plan, (f0.docker.image(the_plan.image).id, f0.checkpoint.config_sha256))


def ask_rank0(group, the_plan, known: tuple[str, str] | None = None):
    """Rank 0's planned argv to the serving image's engine (the image must be on rank 0).
    `known`: rank 0's image ID and config.json's sha256, as just probed: a yes to this very
    question is then given back as remembered (engine_config.remembered), not asked again."""
    from ..gather import engine_config
    from ..plan.cluster_plan import env_file

    conn = next(c for c in group.connections if c.target.rank == 0)
    rank0 = the_plan.ranks[0]
    env = env_file(rank0.env, "rank 0")
    key = engine_config.question_key(rank0.docker_run, rank0.engine, env, *known) if known else None
    answer = engine_config.remembered(None, key) if key else None  # inputs/answers.py's store
    if answer is None:
        answer = engine_config.ask(conn, rank0.docker_run, rank0.engine, env)
        if key:
            engine_config.remember(None, key, answer)
    return answer


def run(loaded: Loaded, *, trust_new: bool = False, image: str | None = None, say=None,
        bandwidth: bool = False, deep: bool = False, begun: cluster.Begun | None = None) -> Report:
    """The whole `check`: connect (one attempt each, the config's connect timeout), gather,
    evaluate; with `bandwidth`, the all-reduce row too; with `deep`, the checkpoint's hashes.
    `begun`: the gather already under way (cluster.Begun, its group with it)."""
    started = time.monotonic()
    begun = begun or cluster.Begun(loaded, probe.open_group(loaded, trust_new=trust_new, say=say), image)
    with begun.group as group:
        inp = begun.result()
        the_plan = plan_or_none(inp)
        ask_engine(inp, group, the_plan)
        report = evaluate(inp, the_plan)
        if bandwidth:
            add_bandwidth(report, inp, group)
        if deep:
            add_hashes(report, inp, group)
    report.seconds = time.monotonic() - started
    return report
