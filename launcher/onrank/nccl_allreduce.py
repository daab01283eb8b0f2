"""`check --bandwidth`'s command per rank: an NCCL all-reduce through torch.distributed.

Run inside the SERVING image on every rank at once (launcher/check/bandwidth.py builds the
`docker run`), as

    python3 -c '<this script>' '<args as one JSON object>'

so it is a self-contained script: the standard library and torch only, no imports from
`launcher`, and torch is imported only inside `main` (the pure helpers below import without it).

Rendezvous: torch.distributed with backend "nccl" and init_method tcp://MASTER_ADDR:MASTER_PORT;
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment (the container's env
file), each overridable by the same key in lower case in the arguments (rank, world, master_addr,
master_port). NCCL reads the rest of its configuration (NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
NCCL_IB_GID_INDEX, ...) from the environment itself: this script sets none of it.

Arguments (all optional):
  device      "cuda:0" (a Spark has one GPU)
  bytes       size of the all-reduced buffer, default 256 MiB: large enough for bus bandwidth
              to reach its plateau (nccl-tests' curves flatten from ~64-128 MB), small enough
              to cost nothing on a GB10 whose memory the engine shares (~20 ms per all-reduce
              at 20 GB/s on four ranks)
  dtype       "bfloat16" (the engine's activations), or "float16" / "float32"
  warmup      untimed all-reduces first (NCCL connects lazily; the first ones set up), default 5
  iters       timed all-reduces, default 20
  timeout_s   rendezvous and collective timeout, default 60
  deadline_s  the whole run; past it one JSON error is printed and the process exits, default 180

Output: ONE JSON line on stdout (NCCL_DEBUG output may share stdout; the reader takes the last
line that parses):
  {"rank", "world", "bytes", "dtype", "iters", "warmup", "seconds" (the timed loop),
   "algbw_gbps", "busbw_gbps", "nccl_version", "torch_version", "device", "device_name",
   "correct"}
with GB/s = 1e9 bytes/s and busbw = algbw * 2(n-1)/n, nccl-tests' definition for all-reduce.
`correct` comes from one more all-reduce of a per-element, per-rank pattern whose sum is exact
in bf16. Any failure -- no torch, no CUDA, no NCCL, rendezvous or NCCL init failure, a wrong sum,
the deadline -- is instead {"error", "stage", "rank", ...} and a non-zero exit, never a bare
traceback. Stages: args, import, cuda, rendezvous, nccl_init, allreduce, verify (plus
"timeout": true when the deadline struck).
"""

import json
import os
import sys
import threading
import time

DEFAULT_BYTES = 256 << 20
DEFAULTS = {"device": "cuda:0", "bytes": DEFAULT_BYTES, "dtype": "bfloat16", "warmup": 5,
            "iters": 20, "timeout_s": 60, "deadline_s": 180}
ENV_KEYS = {"rank": "RANK", "world": "WORLD_SIZE", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
PATTERN = 7  # element i carries i % PATTERN: sums stay small integers, exact in bf16 up to 16 ranks
EXIT_ERROR = 3


class Failure(Exception):
    def __init__(self, stage, message):
        Exception.__init__(self, message)
        self.stage = stage


def bus_factor(world):
    """nccl-tests' all-reduce bus factor: each byte crosses 2(n-1)/n links' worth of a ring."""
    return 2.0 * (world - 1) / world if world > 0 else 0.0


def algbw_gbps(nbytes, seconds_per_iter):
    return nbytes / seconds_per_iter / 1e9 if seconds_per_iter > 0 else 0.0


def busbw_gbps(nbytes, seconds_per_iter, world):
    return algbw_gbps(nbytes, seconds_per_iter) * bus_factor(world)


def expected_sum(world, pattern_value):
    """What element i holds after the check's all-reduce: every rank r contributes
    (i % PATTERN) + r + 1."""
    return world * pattern_value + world * (world + 1) // 2


def parse_args(argv, environ):
    """The arguments (argv[1] as JSON) over the defaults, with rank/world/master from the
    environment unless the arguments name them. Raises Failure("args", ...)."""
    args = dict(DEFAULTS)
    if len(argv) > 1 and argv[1].strip():
        try:
            given = json.loads(argv[1])
        except ValueError as e:
            raise Failure("args", "arguments are not JSON: %s" % e)
        if not isinstance(given, dict):
            raise Failure("args", "arguments must be one JSON object")
        args.update(given)
    for key, env in ENV_KEYS.items():
        if args.get(key) is None and environ.get(env):
            args[key] = environ[env]
    missing = [ENV_KEYS[k] for k in ENV_KEYS if args.get(k) is None]
    if missing:
        raise Failure("args", "%s not set (environment or arguments)" % ", ".join(missing))
    try:
        for key in ("rank", "world", "master_port", "bytes", "warmup", "iters"):
            args[key] = int(args[key])
        for key in ("timeout_s", "deadline_s"):
            args[key] = float(args[key])
    except (TypeError, ValueError) as e:
        raise Failure("args", "not a number: %s" % e)
    if args["dtype"] not in DTYPE_SIZES:
        raise Failure("args", "dtype %r: one of %s" % (args["dtype"], ", ".join(DTYPE_SIZES)))
    if not 0 <= args["rank"] < args["world"]:
        raise Failure("args", "rank %d outside world size %d" % (args["rank"], args["world"]))
    if args["bytes"] < DTYPE_SIZES[args["dtype"]] or args["iters"] < 1 or args["warmup"] < 0:
        raise Failure("args", "bytes, iters must be positive, warmup not negative")
    return args


class Reporter:
    """Prints exactly one JSON line, whichever comes first: the result, an error, the deadline."""

    def __init__(self, base):
        self.base = base
        self.stage = "args"
        self.lock = threading.Lock()
        self.done = False

    def emit(self, obj):
        with self.lock:
            if self.done:
                return False
            self.done = True
            out = dict(self.base)
            out.update(obj)
            sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
            sys.stdout.flush()
            return True

    def fail(self, stage, message, **extra):
        extra.update({"error": message, "stage": stage})
        return self.emit(extra)

    def arm(self, seconds):
        """After `seconds`, report a timeout in the current stage and end the process at once
        (a hung NCCL call cannot be interrupted from Python)."""
        def fire():
            if self.fail(self.stage, "timed out after %.0f s in stage %s" % (seconds, self.stage),
                         timeout=True):
                os._exit(EXIT_ERROR)
        t = threading.Timer(seconds, fire)
        t.daemon = True
        t.start()
        return t


def measure(args, reporter):
    """The measurement itself; raises Failure with the stage it failed in."""
    reporter.stage = "import"
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # ImportError, or a torch whose CUDA libraries do not load
        raise Failure("import", "no usable torch in %s (%s): %s"
                      % (sys.executable, sys.version.split()[0], _one_line(e)))
    from datetime import timedelta

    reporter.base["torch_version"] = torch.__version__
    reporter.stage = "cuda"
    if not torch.cuda.is_available():
        raise Failure("cuda", "torch %s sees no CUDA device (is the container started with --gpus?)"
                      % torch.__version__)
    if not dist.is_available() or not dist.is_nccl_available():
        raise Failure("cuda", "torch %s was built without NCCL" % torch.__version__)
    try:
        device = torch.device(args["device"])
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
    except Exception as e:
        raise Failure("cuda", "device %s: %s" % (args["device"], _one_line(e)))
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        nccl = None
    reporter.base.update({"device": str(device), "device_name": name, "nccl_version": nccl})

    reporter.stage = "rendezvous"
    init = "tcp://%s:%d" % (args["master_addr"], args["master_port"])
    try:
        dist.init_process_group("nccl", init_method=init, rank=args["rank"], world_size=args["world"],
                                timeout=timedelta(seconds=args["timeout_s"]))
    except Exception as e:
        raise Failure("rendezvous", "%s (rank %d of %d): %s" % (init, args["rank"], args["world"], _one_line(e)))
    try:
        dtype = getattr(torch, args["dtype"])
        count = args["bytes"] // DTYPE_SIZES[args["dtype"]]
        nbytes = count * DTYPE_SIZES[args["dtype"]]
        reporter.base["bytes"] = nbytes
        try:
            buf = torch.zeros(count, dtype=dtype, device=device)
        except Exception as e:
            raise Failure("cuda", "cannot allocate %d bytes on %s: %s" % (nbytes, device, _one_line(e)))

        reporter.stage = "nccl_init"  # NCCL builds its communicator at the first collective
        try:
            dist.all_reduce(buf)
            torch.cuda.synchronize(device)
        except Exception as e:
            raise Failure("nccl_init", _one_line(e))

        reporter.stage = "allreduce"
        try:
            for _ in range(args["warmup"]):
                dist.all_reduce(buf)
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(args["iters"]):
                dist.all_reduce(buf)
            torch.cuda.synchronize(device)
            seconds = time.perf_counter() - started
        except Exception as e:
            raise Failure("allreduce", _one_line(e))

        reporter.stage = "verify"
        try:
            # built in the buffer's dtype (exact: small integers), no buffer-sized int64 temporaries
            pattern = torch.arange(PATTERN, dtype=dtype, device=device).repeat(count // PATTERN + 1)[:count]
            buf.copy_(pattern).add_(args["rank"] + 1)
            dist.all_reduce(buf)
            want = pattern.mul_(args["world"]).add_(expected_sum(args["world"], 0))
            wrong = int(torch.count_nonzero(buf != want).item())
            torch.cuda.synchronize(device)
        except Exception as e:
            raise Failure("verify", _one_line(e))
        per_iter = seconds / args["iters"]
        result = {"iters": args["iters"], "warmup": args["warmup"], "seconds": round(seconds, 6),
                  "algbw_gbps": round(algbw_gbps(nbytes, per_iter), 3),
                  "busbw_gbps": round(busbw_gbps(nbytes, per_iter, args["world"]), 3),
                  "correct": wrong == 0}
        if wrong:
            result["error"] = "all-reduce sum wrong in %d of %d elements" % (wrong, count)
            result["stage"] = "verify"
        return result
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _one_line(e):
    text = " ".join(str(e).split())
    text = text if len(text) <= 600 else text[:600] + "..."
    return "%s: %s" % (type(e).__name__, text) if text else type(e).__name__


def main(argv, environ=None):
    environ = os.environ if environ is None else environ
    reporter = Reporter({"rank": None, "world": None, "bytes": None, "correct": False})
    try:
        args = parse_args(argv, environ)
    except Failure as e:
        reporter.fail(e.stage, str(e))
        return 2
    reporter.base.update({"rank": args["rank"], "world": args["world"], "bytes": args["bytes"],
                          "dtype": args["dtype"]})
    reporter.arm(args["deadline_s"])
    try:
        result = measure(args, reporter)
    except Failure as e:
        reporter.fail(e.stage, str(e))
        return EXIT_ERROR
    except BaseException as e:  # whatever else: still one JSON line
        reporter.fail(reporter.stage, _one_line(e))
        return EXIT_ERROR
    if not reporter.emit(result):
        return EXIT_ERROR  # the deadline struck first
    return EXIT_ERROR if result.get("error") else 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    # os._exit: a wedged NCCL thread must not keep the process (and the rank's container) alive
    os._exit(code)
