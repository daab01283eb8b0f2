"""Image references split by the one parser (launcher/facts/image_ref.py), with the names the kit
meets: Docker Hub names, NGC's, a local registry's with a port, the chain's content tags, digests."""

import pytest

from launcher.facts.image_ref import ImageRef

DIGEST = "sha256:01260f3072ec2df9356826bf746fe3f92882c8a61dec0e36ca7896d61cdc0072"


@pytest.mark.parametrize("ref, parts", [
    ("busybox", (None, "busybox", None, None)),
    ("sparkstack/keys:3f2a9c1b7e4d", (None, "sparkstack/keys", "3f2a9c1b7e4d", None)),
    ("nvcr.io/nvidia/vllm:25.09-py3", ("nvcr.io", "nvidia/vllm", "25.09-py3", None)),
    ("localhost:5000/sparkstack/keys", ("localhost:5000", "sparkstack/keys", None, None)),
    ("127.0.0.1:41234/sparkstack/keys:3f2a", ("127.0.0.1:41234", "sparkstack/keys", "3f2a", None)),
    ("127.0.0.1:{port}/sparkstack/keys:3f2a", ("127.0.0.1:{port}", "sparkstack/keys", "3f2a", None)),  # the relay's
    ("localhost/mia/vllm:dcp", ("localhost", "mia/vllm", "dcp", None)),
    ("mia:5000", (None, "mia", "5000", None)),  # no `/` after it: a name and a tag, not a registry
    (f"ubuntu@{DIGEST}", (None, "ubuntu", None, DIGEST)),
    (f"nvcr.io/nvidia/vllm:25.09@{DIGEST}", ("nvcr.io", "nvidia/vllm", "25.09", DIGEST)),
])
def test_parts_and_back(ref, parts):
    parsed = ImageRef.parse(ref)
    assert (parsed.registry, parsed.path, parsed.tag, parsed.digest) == parts
    assert str(parsed) == ref


@pytest.mark.parametrize("ref, repository, tagged", [
    ("busybox", "busybox", "busybox:latest"),
    ("nvcr.io/nvidia/vllm:25.09-py3", "nvcr.io/nvidia/vllm", "nvidia/vllm:25.09-py3"),
    ("localhost:5000/sparkstack/keys", "localhost:5000/sparkstack/keys", "sparkstack/keys:latest"),
])
def test_repository_and_tagged(ref, repository, tagged):
    assert (ImageRef.parse(ref).repository, ImageRef.parse(ref).tagged) == (repository, tagged)
