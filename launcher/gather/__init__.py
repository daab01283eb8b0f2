"""Gather: everything the plan and the judging take, read from the ranks and from this host, as
ONE value (value.Gathered), by one call (cluster.gather) that `check` and `up` share: the
probe on every rank (probe), right after it on each rank the fabric pings and dockerd's
capabilities (extras) and, with model.local_path, the staged copy's listing (staged);
meanwhile this host's part (here: the checkpoint's shape, the serving image's tag and ID, the
API key). A rank that fails is a reason in the value, never an exception. `plan` and `prep`
take the same parts without the pings (probe.gather, then here.inputs / here.read_model); the
ranks' image IDs that `ship` and `up` plan from are ranks.py's; the checkpoint's digests read
on the ranks (`manifest`, `check --deep`) and the manifests kept here are hashes.py's; rank 0's
serving image asked about the planned argv (check's engine config row) is engine_config.py's.

Nothing here judges (launcher/check/) or derives (launcher/plan/): both take the value.
May import `launcher.transport`, `launcher.images` (the image's tag and ID), `launcher.inputs`,
`launcher.facts`, `launcher.onrank` and the top-level modules; never plan, check, apply or cli.
"""
