"""The plan: per rank the environment, the `docker run` and engine argv (engine, templates/engine/),
the KV sizing (kv); and what else is derived from the config alone: the Ansible inventory and the
systemd unit.

Derivation only, nothing here changes a rank. May import `launcher.inputs`, `launcher.facts` and
`launcher.images` (the chain's content tag, for the serving image's name).
"""
