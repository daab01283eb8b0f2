"""An image reference (`[registry/]path[:tag][@digest]`) split into its parts, the one place
the kit reads one: building (pulling the base), the local registry (pushing) and the facts
(finding an image among a rank's) all go through `ImageRef.parse`.

Docker's rules: the first path component names a registry only when a `/` follows it and it
has a `.` or a `:` or is `localhost`; a tag follows the last `:` of the last component; a
digest follows `@`. A missing tag means `latest` where a tag is needed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageRef:
    registry: str | None  # "localhost:5000", "nvcr.io"; None: Docker Hub or a local name
    path: str             # "sparkstack/keys", "nvidia/vllm"
    tag: str | None       # None: none written
    digest: str | None    # "sha256:…" after `@`; None: none written

    @classmethod
    def parse(cls, ref: str) -> "ImageRef":
        name, at, digest = ref.partition("@")
        head, slash, rest = name.partition("/")
        registry = None
        if slash and ("." in head or ":" in head or head == "localhost"):
            registry, name = head, rest
        last = name.rsplit("/", 1)[-1]
        tag = None
        if ":" in last:
            name, _, tag = name.rpartition(":")
        return cls(registry, name, tag, digest if at else None)

    @property
    def repository(self) -> str:
        """What `docker pull REPOSITORY --tag T` takes: the registry and path, no tag."""
        return f"{self.registry}/{self.path}" if self.registry else self.path

    @property
    def tagged(self) -> str:
        """The path with its tag (`latest` when none is written), the registry left out: the
        name the image gets in another registry."""
        return f"{self.path}:{self.tag or 'latest'}"

    def __str__(self) -> str:
        return (self.repository + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))
