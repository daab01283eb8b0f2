"""The engine's compile caches, kept on each rank across boots (issue 15).

vLLM compiles its model graphs (torch.compile, inductor), Triton and FlashInfer JIT-build
kernels and CUDA JIT-compiles PTX on every start into directories inside the container, which
`docker rm` throws away: each boot pays every compile again. The plan mounts one directory per
serving image from the rank (`container.cache_dir`/KEY) and points every cache there:

  VLLM_CACHE_ROOT           vLLM's root (torch_compile_cache/ beneath), vllm/envs.py
  TORCHINDUCTOR_CACHE_DIR   torch inductor's FX graph and kernel cache
  TRITON_CACHE_DIR          Triton's compiled kernels
  FLASHINFER_WORKSPACE_BASE FlashInfer's JIT ops go under BASE/.cache/flashinfer (flashinfer/jit/env.py)
  CUDA_CACHE_PATH           the driver's PTX JIT cache (ComputeCache)

KEY is the serving image's ref made a directory name: a built image's content tag changes with
its content, so a new image starts with an empty cache by itself. A prebuilt ref (a tag that can
move) gets the image ID the rank's Docker reported appended. The directory is made by Docker
(root) on the first start, so a non-root SSH user needs nothing; every start then writes the
kit's MARKER into it through Docker (`docker cp` into the running container's mount: the daemon
writes it, whoever the SSH user is). `down --purge-caches` removes, through sudo as `prep` does
its root steps, only the directories of cache_dir holding that marker: what the kit made, never
another program's entries (launcher/inputs/config.py refuses shallow and shared roots too).
"""

from __future__ import annotations

import re
import shlex

from ..inputs.config import Cluster

IN_CONTAINER = "/var/cache/sparkstack-engine"
ENV = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUDA_CACHE_PATH": "cuda",
}


def key(image: str, image_id: str | None = None) -> str:
    """A directory name for the serving image: its ref, plus its short ID when given."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", image).strip("-.") or "image"
    return f"{name}-{image_id.removeprefix('sha256:')[:12]}" if image_id else name


def host_dir(cluster: Cluster, image: str, image_id: str | None = None) -> str | None:
    root = cluster.container.cache_dir
    return f"{root.rstrip('/')}/{key(image, image_id)}" if root else None


def env(cluster: Cluster) -> dict[str, str]:
    """Where each cache lives inside the container; {} when caches are not kept."""
    if not cluster.container.cache_dir:
        return {}
    return {name: f"{IN_CONTAINER}/{sub}" for name, sub in ENV.items()}


def mounts(cluster: Cluster, image: str, image_id: str | None = None) -> list[str]:
    where = host_dir(cluster, image, image_id)
    return ["-v", f"{where}:{IN_CONTAINER}"] if where else []


_SIZE_MARK = "sparkstack-cache "
_LEFT_MARK = "sparkstack-left "
MARKER = ".sparkstack-cache"  # in every cache directory the kit made
MARKER_TEXT = "made by sparkstack: `sparkstack down --purge-caches` removes this directory\n"


def size_command(cluster: Cluster) -> str | None:
    """Each of the kit's cache directories on a rank (those holding MARKER) with its bytes (`du`
    over what the user can read)."""
    root = cluster.container.cache_dir
    if not root:
        return None
    q = shlex.quote(root.rstrip("/"))
    return (f"[ -d {q} ] || exit 0; for d in {q}/*/; do [ -d \"$d\" ] && [ ! -L \"${{d%/}}\" ] && [ -f \"$d{MARKER}\" ] || continue; "
            f"printf '{_SIZE_MARK}%s %s\\n' \"$(du -sb \"$d\" 2>/dev/null | cut -f1)\" \"$(basename \"$d\")\"; done")


def parse_sizes(stdout: str) -> dict[str, int]:
    """{cache directory name: bytes} from size_command's output."""
    sizes: dict[str, int] = {}
    for line in stdout.splitlines():
        if not line.startswith(_SIZE_MARK):
            continue
        size, _, name = line[len(_SIZE_MARK):].partition(" ")
        if size.isdigit() and name:
            sizes[name] = int(size)
    return sizes


def mark_command(container: str) -> str:
    """Writes MARKER into `container`'s cache mount (after its `docker run -d`): a file made here,
    copied in by the Docker daemon, which made the directory."""
    return (f"m=$(mktemp) && printf %s {shlex.quote(MARKER_TEXT)} > \"$m\" && "
            f"{{ docker cp \"$m\" {shlex.quote(f'{container}:{IN_CONTAINER}/{MARKER}')}; rc=$?; "
            "rm -f \"$m\"; [ $rc = 0 ]; }")


def purge_command(cluster: Cluster) -> str | None:
    """Removes the caches the kit made on a rank (run as root: Docker made them as root): each
    directory of cache_dir holding MARKER, no link followed; anything else there stays, and each
    directory left is named on a line of its own (parse_left)."""
    root = cluster.container.cache_dir
    if not root:
        return None
    q = shlex.quote(root.rstrip("/"))
    return (f"for d in {q}/* {q}/.[!.]*; do [ -e \"$d\" ] || [ -L \"$d\" ] || continue; "
            f"if [ -d \"$d\" ] && [ ! -L \"$d\" ] && [ -f \"$d/{MARKER}\" ] && [ ! -L \"$d/{MARKER}\" ]; "
            f"then rm -rf -- \"$d\" || exit; else printf '{_LEFT_MARK}%s\\n' \"${{d##*/}}\"; fi; done; exit 0")


def parse_left(stdout: str) -> list[str]:
    """The entries of cache_dir purge_command left (not the kit's: no marker)."""
    return [line[len(_LEFT_MARK):] for line in stdout.splitlines() if line.startswith(_LEFT_MARK)]
