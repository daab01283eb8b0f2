#!/usr/bin/env python3
"""Record what real NCCL and torch.distributed say when the kit's all-reduce probe meets a wrong
environment; not a test. Runs on a GPU machine (the device tool's H200) with the machine's torch:

    python3 scripts/record_nccl_messages.py OUT.json [--gpus N]

Each case starts launcher/onrank/nccl_allreduce.py -- the script `check --bandwidth` runs on every
rank -- as one process per rank over MASTER_ADDR=127.0.0.1, with NCCL_DEBUG=WARN, and keeps each
process's exit code, its one JSON line (stage, error) and every `NCCL WARN` line of its output,
verbatim. With one GPU the two-rank cases share it: the bootstrap failures (a closed master port, a
rank that never joins) happen before NCCL looks at the device. OUT.json is the fixture
tests/fixtures/nccl/messages.json that the sandbox's NCCL stand-in and its test read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

PROBE = Path(__file__).resolve().parents[1] / "launcher" / "onrank" / "nccl_allreduce.py"
SMALL = {"bytes": 1 << 20, "warmup": 1, "iters": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    return free_port()


# name -> (what it stands for, env for every rank, world size, ranks started, extra args)
CASES = {
    "ok": ("the probe at world size 1, nothing wrong", {}, 1, [0], {}),
    "net_ib_without_rdma": ("NCCL_NET=IB on a host without a usable RDMA device",
                            {"NCCL_NET": "IB"}, 1, [0], {}),
    "ib_hca_missing": ("NCCL_NET=IB with NCCL_IB_HCA naming a device that does not exist",
                       {"NCCL_NET": "IB", "NCCL_IB_HCA": "=rocep9s0f9"}, 1, [0], {}),
    "ib_hca_missing_no_net": ("NCCL_IB_HCA naming a missing device, NCCL_NET unset (NCCL may fall back)",
                              {"NCCL_IB_HCA": "=rocep9s0f9"}, 1, [0], {}),
    "socket_ifname_missing": ("NCCL_SOCKET_IFNAME naming an interface that does not exist",
                              {"NCCL_SOCKET_IFNAME": "=enp9s9f9np9"}, 1, [0], {}),
    "socket_ifname_missing_prefix": ("NCCL_SOCKET_IFNAME naming an interface prefix nothing matches",
                                     {"NCCL_SOCKET_IFNAME": "enx"}, 1, [0], {}),
    "master_port_closed": ("rank 1 of 2 connects to a master port nothing listens on",
                           {}, 2, [1], {"timeout_s": 15, "deadline_s": 60}),
    "rank_never_joins": ("rank 0 of 2 waits for a rank 1 that is never started",
                         {}, 2, [0], {"timeout_s": 15, "deadline_s": 60}),
    "two_ranks_one_gpu": ("two ranks on one GPU (what a one-GPU machine says at world size 2)",
                          {}, 2, [0, 1], {"timeout_s": 30, "deadline_s": 90}),
}


def warn_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "NCCL WARN" in line or "NCCL INFO NET/" in line]


def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_case(name: str, gpus: int) -> dict:
    what, env_extra, world, started, extra = CASES[name]
    port = closed_port() if name == "master_port_closed" else free_port()
    procs = []
    t0 = time.monotonic()
    for rank in started:
        env = dict(os.environ, NCCL_DEBUG="WARN", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), WORLD_SIZE=str(world), **env_extra)
        args = dict(SMALL, device="cuda:%d" % (rank % gpus), **extra)
        procs.append((rank, subprocess.Popen([sys.executable, str(PROBE), json.dumps(args)], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    ranks = {}
    for rank, p in procs:
        out, _ = p.communicate(timeout=150)
        ranks[str(rank)] = {"rc": p.returncode, "result": last_json(out), "nccl_warn": warn_lines(out),
                            "output_tail": out.splitlines()[-40:]}
    return {"what": what, "env": env_extra, "world": world, "started": started,
            "seconds": round(time.monotonic() - t0, 1), "ranks": ranks}


def main() -> int:
    out = Path(sys.argv[1])
    gpus = int(sys.argv[sys.argv.index("--gpus") + 1]) if "--gpus" in sys.argv else 1
    import torch

    record = {"recorded_with": {"torch": torch.__version__,
                                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                                "device": torch.cuda.get_device_name(0), "gpus": gpus,
                                "probe": "launcher/onrank/nccl_allreduce.py",
                                "command": "python3 scripts/record_nccl_messages.py OUT.json"},
              "cases": {}}
    for name in CASES:
        print("case", name, flush=True)
        record["cases"][name] = run_case(name, gpus)
        print(json.dumps(record["cases"][name], indent=1)[:3000], flush=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
