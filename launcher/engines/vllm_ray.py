"""vLLM on a Ray cluster (cluster.yaml `multinode: ray`): rank 0 starts the Ray head and `vllm
serve` with the Ray executor, ranks > 0 join the head (templates/engine/vllm-ray.j2); the head
starts first. On one rank it is vLLM alone, as natively."""

from __future__ import annotations

from .base import ImageNeed, RankStart
from .vllm_native import VllmNative

RAY_PORT = 6379  # Ray's default GCS port


class VllmRay(VllmNative):
    listed = 1
    multinode = ("ray",)
    head_first = True
    shown_as = "Ray"

    def template_name(self, n_ranks: int) -> str:
        return "vllm-ray.j2" if n_ranks > 1 else super().template_name(n_ranks)

    def managed(self, start: RankStart) -> list[tuple[str, tuple[str, ...]]]:
        if start.n_ranks < 2:
            return super().managed(start)
        return self.sized(start) + [("--distributed-executor-backend", ("ray",))]  # workers join the head

    def image_needs(self, n_ranks: int) -> tuple[ImageNeed, ...]:
        if n_ranks < 2:
            return ()
        return (ImageNeed(("ray", "--version"),
                          "{host}: {image} has no Ray (`ray --version` in the image: {why}); "
                          "multinode: ray needs an image with Ray installed, or use multinode: native"),)

    def notes(self, master: str, n_ranks: int) -> list[str]:
        return [ray_note(master)] if n_ranks > 1 else []

    def template_vars(self) -> dict:
        return {"ray_port": RAY_PORT}


def ray_note(master: str) -> str:
    """What vLLM on Ray leaves open (templates/engine/vllm-ray.j2)."""
    return (f"Ray head on rank 0, joined at {master}:{RAY_PORT}; no dashboard "
            "(--include-dashboard=false). vLLM's Ray executor meets its workers at a free port it "
            "picks on rank 0: master_port / --master-port apply to multinode: native only. "
            "Ray's own servers (its GCS on rank 0, raylet, object "
            "manager and workers on every rank) listen on every interface whatever the flags (Ray has "
            "no option to bind them) and run code for whoever reaches them: keep the ranks' networks "
            "private, or firewall those ports to the ranks (see them: ss -ltnp)")


ENGINE = VllmRay()
