"""The image row: the profile's serving image on every rank, by image ID (against the build
host's when it has the image, else the same on every rank). By content: gather reads a containerd
store's manifest digest as the config digest it names (launcher/images/manifests.py).
"""

from __future__ import annotations

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport
from .drift import drift_row, short_id


@row("image", order=30, reads=("docker",))
def _check_image(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    if inp.image is None:
        rr.add("image", Status.FAIL, f"the profile's image is not known: {inp.image_error}", "sparkstack build")
        return
    if f.docker is None or f.docker.server_version is None:
        rr.add("image", Status.FAIL, f"{inp.image}: cannot ask (no Docker)", "fix the docker row first")
        return
    found = f.docker.image(inp.image)
    containerd = " (its Docker keeps images in containerd's image store)" if f.docker.containerd_store else ""
    if found is None:
        rr.add("image", Status.FAIL, f"{inp.image} missing on rank {r} ({rr.host}){containerd}", "sparkstack ship")
        return
    fix = "sparkstack ship (a rank is re-tagged only once its image ID matches)"
    if inp.local_image_id:  # the build host's is THE image: each rank against it
        if found.id != inp.local_image_id:
            # on containerd's store the ID is a manifest digest: one this host made reads as its config
            unknown = (": a manifest digest this host has no record of (`ship` sends the manifest again, "
                       "a few KB)") if containerd else ""
            rr.add("image", Status.FAIL, f"{inp.image} is {short_id(found.id)} on rank {r}{containerd}{unknown}, "
                   f"{short_id(inp.local_image_id)} on the build host", fix)
        else:
            rr.add("image", Status.PASS, f"{inp.image} {short_id(found.id)}, as on the build host")
        return
    ids = {p: short_id(img.id) for p, x in inp.facts.items() if x.docker
           for img in [x.docker.image(inp.image)] if img}
    drift_row(rr, "image", ids, r, f"{inp.image} {short_id(found.id)}", fix)
