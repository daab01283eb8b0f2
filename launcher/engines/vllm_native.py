"""vLLM with its native multi-node (cluster.yaml `multinode: native`, the default;
docs/architecture.md, "Serving"): one `vllm serve` per Spark, rank 0 the API, ranks > 0 headless
(templates/engine/vllm.j2)."""

from __future__ import annotations

from .base import VLLM_FLAGS, Engine, ImageNeed, RankStart

# vLLM's multiprocessing executor across nodes (--nnodes/--node-rank/--master-addr/--headless)
# is not in old releases; an image older than this is refused rather than handed flags it
# rejects. The seeds run vLLM 0.28 and later.
MIN_NATIVE_MULTINODE = (0, 11, 1)


class VllmNative(Engine):
    listed = 0
    profile_engine = "vllm"
    multinode = ("native",)
    template = "vllm.j2"
    flags = VLLM_FLAGS
    # 29521: MASTER_PORT in Mia AI Lab's .env.tp4.example and start-tp4.sh, the launcher seeds 000
    # and 004 serve with (vLLM's own default is 29501)
    master_port = 29521
    startup_guard = True
    host_ip_env = "VLLM_HOST_IP"

    def sized(self, start: RankStart) -> list[tuple[str, tuple[str, ...]]]:
        """The figures the plan sized, as vLLM flags."""
        out = []
        if start.tp is not None:
            out.append(("--tensor-parallel-size", (str(start.tp),)))
        if start.kv_cache_bytes is not None:
            out.append(("--kv-cache-memory-bytes", (str(start.kv_cache_bytes),)))
        if start.utilization is not None:
            out.append(("--gpu-memory-utilization", (str(start.utilization),)))
        return out + [("--served-model-name", (start.served,)), ("--port", (str(start.port),))]

    def managed(self, start: RankStart) -> list[tuple[str, tuple[str, ...]]]:
        out = self.sized(start)
        if start.n_ranks > 1:  # one process per Spark
            out += [("--nnodes", (str(start.n_ranks),)), ("--node-rank", (str(start.rank),)),
                    ("--master-addr", (start.master,)), ("--master-port", (str(start.master_port),))]
            if start.rank > 0:
                out.append(("--headless", ()))
        return out

    def image_needs(self, n_ranks: int) -> tuple[ImageNeed, ...]:
        if n_ranks < 2:
            return ()
        return (ImageNeed(("vllm", "--version"),
                          "{host}: cannot read the vLLM version of {image} (`vllm --version` in the "
                          "image failed); is it a vLLM image?",
                          MIN_NATIVE_MULTINODE,
                          "{image} has vLLM {version}: native multi-node (--nnodes/--node-rank/"
                          "--master-addr) needs {need} or newer; use a newer image"),)


ENGINE = VllmNative()
