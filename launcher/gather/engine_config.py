"""Ask the serving image itself what its engine makes of the planned argv (issue 32): on rank 0,
in the image, the engine's own argument parsing and configuration with the checkpoint's
config.json, no weights and no memory (launcher/onrank/engine_config.py). On real Sparks that is
real vLLM 0.33 with the image's plugins (`vllm serve`'s parser, then
`AsyncEngineArgs.create_engine_config()`, then the attention backend's choice); in the sandbox the
stand-in's same checks (standin_vllm.validate). Seconds, against the minutes of a real load.

Asked after the plan is made (the argv is the plan's) and once the image is on rank 0: `check`
asks it (apply/preflight.py), `up` asks it after shipping and before starting anything
(apply/deploy.py); the `engine config` row judges the answer.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from .. import onrank
from ..inputs import answers
from ..transport.remote import Connection

# what the question is on a real Spark (the script's real_vllm), said in the row
REAL_COMMAND = ("python3 -c 'parser = make_arg_parser(FlexibleArgumentParser()); "
                "AsyncEngineArgs.from_cli_args(parser.parse_args(ARGV)).create_engine_config(); "
                "get_attn_backend(...)' (vLLM's own code, in the serving image)")
MARK = "ENGINECONF "


@dataclass(frozen=True)
class EngineAnswer:
    """The image's answer: ok (True/False), or None when it could not be asked (`error`)."""

    ok: bool | None
    message: str
    seconds: float
    image: str
    error: str | None = None
    asked_at: str | None = None  # when a remembered answer was given (same question since)


def _script() -> str:
    return onrank.source("engine_config").decode()


def serve_argv(engine: list[str]) -> list[str] | None:
    """The tokens after `vllm serve` in a rank's engine argv (also inside the Ray head's
    `sh -c '... && exec vllm serve ...'`); None when the engine is not `vllm serve`."""
    tokens = shlex.split(engine[2]) if engine[:2] == ["sh", "-c"] and len(engine) > 2 else list(engine)
    at = next((i for i in range(len(tokens) - 1) if tokens[i:i + 2] == ["vllm", "serve"]), None)
    if at is None:
        return None
    out = []
    for t in tokens[at + 2:]:
        if t == "&&":
            break
        out.append(t)
    return out


def command(docker_run: list[str], engine: list[str]) -> str | None:
    """The one-off `docker run` of rank 0's planned container (its mounts, GPU and env; no
    network, not detached, no name) that runs the question instead of the engine."""
    argv = serve_argv(engine)
    if argv is None:
        return None
    run = list(docker_run)
    image = run.pop()
    out, skip = ["docker", "run", "--rm", "--network", "none"], 0
    for token in run[2:]:
        if skip:
            skip -= 1
            continue
        if token in ("-d",):
            continue
        if token in ("--name", "--network", "--label", "--ipc"):
            skip = 1
            continue
        out.append(token)
    out += ["--entrypoint", "python3", image, "-c", _script(), json.dumps({"argv": argv})]
    return shlex.join(out)


def ask(conn: Connection, docker_run: list[str], engine: list[str], env_file: bytes,
        timeout: float = 300) -> EngineAnswer:
    image = docker_run[-1]
    line = command(docker_run, engine)
    if line is None:
        return EngineAnswer(None, "", 0.0, image, "the engine is not `vllm serve`: nothing to ask")
    started = time.monotonic()
    r = conn.run(line, stdin=env_file, timeout=timeout)
    seconds = time.monotonic() - started
    found = [ln for ln in r.stdout.splitlines() if ln.startswith(MARK)] if r.stdout else []
    if not found:
        return EngineAnswer(None, "", seconds, image, f"the image gave no answer ({r.why()})")
    status, _, text = found[-1][len(MARK):].partition(" ")
    try:
        message = json.loads(text)
    except ValueError:
        message = text
    return EngineAnswer(status == "OK", message, seconds, image)


# -- remembered answers -----------------------------------------------------------------------
# The engine's configuration is a function of the image, the argv, the env and the checkpoint's
# config.json: asked again with all four the same, it answers the same. A yes is kept on the
# control host under a hash of the four (the image by its ID on rank 0, the config by its
# sha256; launcher/inputs/answers.py) and given back instead of a `docker run` (~0.65 s of every
# `check`, and of `up`'s start); a no is always asked afresh, so a fix outside the four is seen at once.

def question_key(docker_run: list[str], engine: list[str], env_file: bytes, image_id: str,
                 config_sha256: str) -> str:
    return answers.key("engine-config", docker_run, engine, env_file.decode(errors="replace"), image_id,
                       config_sha256)


def remembered(store: Path | None, key: str) -> EngineAnswer | None:
    kept = answers.known(key, store)
    try:
        return EngineAnswer(True, kept["message"], kept["seconds"], kept["image"], asked_at=kept["at"])
    except (KeyError, TypeError):
        return None


def remember(store: Path | None, key: str, answer: EngineAnswer) -> None:
    if answer.ok:
        answers.keep(key, {"message": answer.message, "seconds": answer.seconds, "image": answer.image}, store)
