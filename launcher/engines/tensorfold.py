"""TensorFold, GLM-5.3's own engine (seed 001's recipe, one-shot.sh): the same `tensorfold serve`
on every Spark, each with its own --rank; rank 0 serves the OpenAI API, ranks > 0 follow it
(templates/engine/tensorfold.j2). Its flags are passed as written: its own parser checks them."""

from __future__ import annotations

import shlex
from pathlib import Path

from .base import AS_WRITTEN, Engine, NoApiKey, RankStart

# GLM-5.3's TensorFold engine serves at --tp 4 only, one rank per Spark (seed 001; its image is
# built for that CUDA_TP): any other rank count would pass `plan` and fail at start on every rank.
TENSORFOLD_TP = 4

# TensorFold flags the plan sets from the cluster (TensorFold.managed), and where to set them.
TENSORFOLD_MANAGED = {"--tp": "from ranks", "--rank": "from ranks", "--master": "from rendezvous",
                      "--master-port": "from master_port",
                      "--port": "from overrides.api_port", "--host": "0.0.0.0, so the API is reachable",
                      "--name": "from model.served_name"}


class TensorFold(Engine):
    listed = 2
    profile_engine = "tensorfold"
    template = "tensorfold.j2"
    flags = AS_WRITTEN
    # its own default (seed 001's one-shot.sh passes none; its RoCE reductions' Gloo group takes
    # the port 11 above)
    master_port = 29551
    # Its server is OpenAI-compatible, not vLLM: seed 001 lists no prompt_logprobs (vLLM's own
    # extension) for it. `verify` asks anyway and reads a perplexity when they come; without them
    # it checks the greedy probes (alone and crowded) only, and says so.
    prompt_logprobs = False
    no_api_key = NoApiKey("tensorfold", "TensorFold's server checks no API key (seed 001): anyone who "
                          "reaches rank 0's API port can use it; keep that port on a private network")

    def managed(self, start: RankStart) -> list[tuple[str, tuple[str, ...]]]:
        """Seed 001's recipe: `serve MODEL --tp N --rank R --master M --port P --host 0.0.0.0
        --name NAME` plus an explicit --master-port (config.master_port); the profile's flags and
        the config's follow (TensorFold's argparse takes the last of a repeated flag, so the
        config's win). --host: TensorFold listens on 127.0.0.1 by default, which the control host
        cannot reach."""
        return [("--tp", (str(start.n_ranks),)), ("--rank", (str(start.rank),)),
                ("--master", (start.master,)), ("--master-port", (str(start.master_port),)),
                ("--port", (str(start.port),)), ("--host", ("0.0.0.0",)), ("--name", (start.served,))]

    def config_problems(self, path: Path, cluster, profile) -> list[str]:
        """The rank count it serves at, the flags the plan manages, and an API key its server
        would not ask for."""
        problems = []
        if len(cluster.ranks) != TENSORFOLD_TP:
            problems.append(f"{path}: ranks: {len(cluster.ranks)} ranks listed, but profile {profile.name} "
                            f"runs TensorFold's GLM-5.3 engine, which serves at --tp {TENSORFOLD_TP} only: "
                            f"list {TENSORFOLD_TP} ranks, or choose a vLLM profile")
        for where, lines in ((f"profile {profile.name}: args", profile.args),
                             ("overrides.engine_args", cluster.overrides.engine_args)):
            try:
                tokens = [token for line in lines for token in shlex.split(line)]
            except ValueError as e:
                problems.append(f"{path}: {where}: {e}")
                continue
            for token in tokens:
                name = token.partition("=")[0]
                if name in TENSORFOLD_MANAGED:
                    problems.append(f"{path}: {where}: {name} is set by the plan ({TENSORFOLD_MANAGED[name]})")
        if cluster.overrides.api_key:
            problems.append(f"{path}: overrides.api_key: TensorFold's server checks no API key (seed 001: "
                            "keep it on a private network); remove api_key for profile " + profile.name)
        return problems


ENGINE = TensorFold()
