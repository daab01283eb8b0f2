"""`up` plans its ship from the image IDs its own probe listed (deploy._images_seen): one probe per
rank per command, no second round of questions; a rank its probe could not list is asked again."""

from __future__ import annotations

from types import SimpleNamespace

from launcher.apply import deploy
from launcher.facts.docker import Docker, Image

FULL = "sha256:" + "ab" * 32


def gathered(*images_per_rank):
    ranks = {}
    for r, images in enumerate(images_per_rank):
        docker = None if images is None else Docker("28.0", "28.0", "/var/lib/docker", None, None, tuple(images))
        ranks[r] = SimpleNamespace(facts=SimpleNamespace(docker=docker))
    return SimpleNamespace(ranks=ranks)


def test_each_rank_image_id_as_listed_and_none_where_it_lacks_it():
    seen = deploy._images_seen(gathered([Image(FULL, ("img:1",), {}, None)], []), "img:1")
    assert seen == {0: {"img:1": FULL}, 1: {}}


def test_a_rank_without_docker_facts_or_with_a_short_id_is_asked_again():
    assert deploy._images_seen(gathered([Image(FULL, ("img:1",), {}, None)], None), "img:1") is None
    assert deploy._images_seen(gathered([Image("abcdef123456", ("img:1",), {}, None)]), "img:1") is None
