#!/usr/bin/env python3
"""SANDBOX STAND-IN for TensorFold's `python3 -m tensorfold.cli serve` (the engine of seed 001's
prebuilt image). This is NOT TensorFold: it loads no weights and needs no GPU. Standard library
only. In the sandbox's `sandbox-vllm` image it is `tensorfold/cli.py` in dist-packages
(launcher/sandbox/debian_image.py), beside standin_vllm.py, whose OpenAI HTTP engine it serves,
and standin_dist.py, which connects the ranks as the real stack does.

What it mimics (TensorFold's src/tensorfold/cli.py and families/glm_moe_dsa, the glm53-tp4 code
the image is built from):
- argv: `serve MODEL [options]` with the real serve options, their types and choices (`--tp`
  1|2|4, `--rank` 0-3, ...): what argparse refuses exits 2 with argparse's message. `tensorfold
  DIR ...` is `serve DIR ...`; `--version`. Other commands (pull, models, ...) are not here.
- the checks `serve` makes before it loads weights, each exiting 1 with `tensorfold: <message>`
  as cli.main prints them: the model is a directory (a Hub repo id cannot be downloaded here),
  its config.json reads, its model_type has a family (this stand-in knows only glm_moe_dsa,
  GLM-5.3), the checkpoint is EXL3, --context fits the model's window, --master is given with
  --tp > 1, --rank < --tp, and GLM-5.3 runs at --tp 4 only (its CUDA_TP).
- the cluster: --tp ranks connect as torch.distributed / NCCL / Gloo do, rank 0 at
  --master:--master-port (standin_dist.form_cluster, over the sandbox's real network), before
  rank 0 serves or a worker follows; a failure exits 1 with the real stack's message.
- rank 0 serves the OpenAI API on --host:--port (default 127.0.0.1:8080, as TensorFold's) under
  --name, else the model directory's name, with GLM-5.3's MTP drafts (k=2) unless --no-drafts or
  --mtp-drafts 0; ranks > 0 follow rank 0 until SIGTERM. TensorFold reads no API key.
- it records argv, options and environment as JSON once argv parses (SANDBOX_TENSORFOLD_RECORD,
  default /var/log/sandbox-vllm/tensorfold.json) so tests can assert on what was started.

Knobs: SANDBOX_TENSORFOLD_WAIT_S (600, the TCPStore timeout of TensorFold's comm.py) bounds the
cluster forming; standin_vllm's SANDBOX_VLLM_* pacing knobs apply to the API.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import standin_dist
import standin_vllm

VERSION = "0.6.5"
DEFAULT_RECORD = "/var/log/sandbox-vllm/tensorfold.json"
COMMANDS = ("serve", "pull", "models", "info", "update")
# The one family the kit serves (families/glm_moe_dsa): model_type -> (TITLE, CUDA_TP).
FAMILIES = {"glm_moe_dsa": ("GLM-5.3", (4,))}
MTP_DRAFTS = 2  # glm_moe_dsa's drafts a round unless --mtp-drafts says otherwise
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
OFFLINE = ("An error happened while trying to locate the file on the Hub and we cannot find the "
           "requested files in the local cache. Please check your connection and try again or make "
           "sure your Internet connection is on.")

# `tensorfold serve`'s options as TensorFold 0.6.5 declares them: (flags, argparse keywords).
SERVE_OPTIONS: list[tuple[tuple[str, ...], dict]] = [
    (("--host",), {"default": "127.0.0.1"}),
    (("--port",), {"type": int, "default": 8080}),
    (("--name",), {"default": ""}),
    (("--alias",), {"action": "append", "default": []}),
    (("--vision",), {"action": "store_true"}),
    (("--vision-urls",), {"action": "store_true"}),
    (("--context",), {"type": int, "default": None}),
    (("--max-tokens",), {"type": int, "default": 4096}),
    (("--temperature",), {"type": float, "default": None}),
    (("--top-p",), {"type": float, "default": None}),
    (("--top-k",), {"type": int, "default": None}),
    (("--min-p",), {"type": float, "default": None}),
    (("--thinking",), {"action": argparse.BooleanOptionalAction, "default": True}),
    (("--reasoning-effort",), {"choices": ("low", "medium", "xhigh"), "default": None}),
    (("--thinking-budget",), {"type": int, "default": 0}),
    (("--no-drafts",), {"action": "store_true"}),
    (("--drafter",), {"default": "auto"}),
    (("--drafter-bits",), {"type": int, "default": 4}),
    (("--mtp-drafts",), {"type": int, "default": None}),
    (("--mtp-confidence",), {"type": float, "default": None}),
    (("--lane-kernels",), {"choices": ("auto", "on", "off"), "default": "auto"}),
    (("--prompt-cache-gib",), {"type": float, "default": None}),
    (("--checkpoint-slots",), {"type": int, "default": None}),
    (("--spill-gib",), {"type": float, "default": 0.0}),
    (("--snapshot-dir",), {"default": str(Path.home() / ".cache" / "tensorfold" / "prefix-snapshots")}),
    (("--max-snapshots",), {"type": int, "default": 3}),
    (("--parallel",), {"default": "auto"}),
    (("--decode-share",), {"type": float, "default": None}),
    (("--mlx-cache-gib",), {"type": float, "default": 8.0}),
    (("--ssd-experts",), {"type": float, "default": None, "metavar": "GIB"}),
    (("--ple-on-ssd",), {"action": "store_true"}),
    (("--no-update-check",), {"action": "store_true"}),
    (("--backend",), {"choices": ("auto", "mlx", "cuda"), "default": "auto"}),
    (("--tp",), {"type": int, "choices": (1, 2, 4), "default": 1}),
    (("--rank",), {"type": int, "choices": (0, 1, 2, 3), "default": 0}),
    (("--master",), {"default": ""}),
    (("--master-port",), {"type": int, "default": 29551}),
    (("--kv-dtype",), {"choices": ("bf16", "int8", "int4"), "default": "bf16"}),
]


def log(msg: str) -> None:
    print(f"[tensorfold] {msg}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorfold", description="SANDBOX STAND-IN for TensorFold's CLI (not TensorFold)")
    parser.add_argument("--version", action="version", version=f"tensorfold {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model at an OpenAI-compatible endpoint")
    serve.add_argument("model")
    for flags, kw in SERVE_OPTIONS:
        serve.add_argument(*flags, **kw)
    return parser


def write_record(path: str, argv: list[str], args: argparse.Namespace) -> None:
    """{"argv", "model", "mode": "api"|"follower", "options": every serve option, "env", "pid",
    "version", "started_at"}, written atomically so a reader never sees half a file."""
    options = {k: v for k, v in vars(args).items() if k not in ("command", "model")}
    record = {"argv": argv, "model": args.model, "mode": "follower" if args.rank else "api",
              "options": options, "env": dict(os.environ), "pid": os.getpid(), "version": VERSION,
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    standin_vllm.write_json_atomically(path, record)


# ---------------------------------------------------------------- what `serve` refuses

def model_dir(model: str) -> Path:
    """cli._config_dir: a directory, else a Hub repo id (whose download fails in the sandbox)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if not REPO_ID.match(model):
        raise FileNotFoundError(f"{model} is neither a directory nor a Hugging Face repo id (owner/name)")
    raise FileNotFoundError(OFFLINE)


def family(config: dict) -> tuple[str, tuple[int, ...]]:
    kind = str(config.get("model_type") or config.get("text_config", {}).get("model_type") or "")
    if kind not in FAMILIES:
        raise ValueError(f"TensorFold has no family for model_type {kind!r} (known: {sorted(FAMILIES)})")
    return FAMILIES[kind]


def check_options(args: argparse.Namespace, title: str) -> None:
    """cmd_serve's refusals for a CUDA-only family that streams no experts and has no PLE tables."""
    if args.ssd_experts is not None:
        raise ValueError(f"--ssd-experts takes a positive GiB count for a family that streams experts; "
                         f"{title} does not")
    if args.ple_on_ssd:
        raise ValueError(f"--ple-on-ssd: {title} has no n-gram (PLE) tables to read from SSD")
    if args.backend == "mlx":
        raise ValueError(f"{title} runs on NVIDIA GPUs only (see docs/recipes)")


def window(args: argparse.Namespace, config: dict) -> int:
    """--context, else the model's max_position_embeddings; never past the model's window."""
    text = config.get("text_config") or config
    limit = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    native = int(limit) if isinstance(limit, int) and limit > 0 else 0
    context = native if args.context is None else int(args.context)
    if context < 0:
        raise ValueError("--context must be 0 or a positive token count")
    if native and context > native:
        raise ValueError(f"--context {context} exceeds this model's {native}-token window")
    return context


def check_exl3(config: dict, title: str) -> None:
    """glm_moe_dsa.check: the engine reads EXL3 checkpoints only."""
    found = config.get("quantization_config") or config.get("quantization") or {}
    method = found.get("quant_method") if isinstance(found, dict) else None
    if method != "exl3":
        raise ValueError(f"{title}'s CUDA engine reads EXL3 checkpoints (routed experts at any width, "
                         f"other linears EXL3 or bf16); this checkpoint is {method or 'unquantized'}.")


def check_ranks(args: argparse.Namespace, title: str, tp_sizes: tuple[int, ...]) -> None:
    """cli._serve_cuda, in its order."""
    if args.tp > 1 and not args.master:
        raise ValueError(f"--tp {args.tp} needs --master: rank 0's address on the link between the machines")
    if args.rank >= args.tp:
        raise ValueError(f"--rank {args.rank} needs --tp {args.rank + 1} or more (ranks are 0 to tp - 1)")
    if args.tp not in tp_sizes:
        raise ValueError(f"{title} runs on CUDA with --tp " + " or ".join(map(str, tp_sizes))
                         + f", not {args.tp}")


def parallel(value: str) -> int:
    """cli._parallel: a number or auto (CUDA: one stream at a time)."""
    if str(value).strip().lower() == "auto":
        return 1
    try:
        return max(1, int(value))
    except ValueError:
        raise SystemExit(f"--parallel takes a number or auto, not {value!r}") from None


# ---------------------------------------------------------------- serving

def api_options(args: argparse.Namespace, served: str, context: int) -> dict:
    """standin_vllm's engine options for what TensorFold's server does: its name, the context
    window (0: no limit), MTP drafts, where it listens."""
    drafts = 0 if args.no_drafts else (MTP_DRAFTS if args.mtp_drafts is None else args.mtp_drafts)
    return {"served_model_name": [served, *args.alias], "host": args.host, "port": args.port,
            "max_model_len": context or None,
            "speculative_config": {"method": "mtp", "num_speculative_tokens": drafts} if drafts else None}


def serve(args: argparse.Namespace) -> int:
    started = time.monotonic()
    directory = model_dir(args.model)
    config = json.loads((directory / "config.json").read_text())
    title, tp_sizes = family(config)
    check_options(args, title)
    context = window(args, config)
    check_exl3(config, title)
    log(f"{title} runs on four NVIDIA GPUs with 128 GB each (four DGX Sparks): serve with --tp 4 on all four")
    check_ranks(args, title, tp_sizes)
    parallel(args.parallel)
    served = args.name or directory.name
    where = f", rank {args.rank} of {args.tp}" if args.tp > 1 else ""
    log(f"loading {served}: {title} (glm_moe_dsa) on CUDA{where} (SANDBOX STAND-IN, not TensorFold)")
    problem = standin_dist.form_cluster(
        node_rank=args.rank, nnodes=args.tp, master_addr=args.master, master_port=args.master_port,
        env=dict(os.environ), timeout_s=float(os.environ.get("SANDBOX_TENSORFOLD_WAIT_S", 600)),
        stop=standin_vllm.STOP, log=log)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return 1
    if args.rank > 0:
        log(f"rank {args.rank} ready in {time.monotonic() - started:.1f}s, following rank 0")
        standin_vllm.wait_for_signal()
        return 0
    log(f"serving {served} at http://{args.host}:{args.port}/v1 on CUDA{where} "
        f"(context: {context or 'unlimited'})")
    return standin_vllm.serve(served, api_options(args, served, context))


def main(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS and Path(argv[0]).is_dir():
        argv = ["serve", *argv]  # `tensorfold DIR ...` is `tensorfold serve DIR ...`
    args = build_parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):  # early, so a stop while forming is clean too
        signal.signal(sig, lambda *_: standin_vllm.STOP.set())
    write_record(os.environ.get("SANDBOX_TENSORFOLD_RECORD", DEFAULT_RECORD), argv, args)
    os.environ.pop("VLLM_API_KEY", None)  # the vLLM engine would honour it; TensorFold reads no key
    try:
        return serve(args)
    except (FileNotFoundError, ValueError) as exc:  # what cli.main catches and prints
        print(f"tensorfold: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
