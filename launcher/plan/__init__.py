"""The plan: per rank the environment, the `docker run` and engine argv (the engine's flags and
template, asked of launcher/engines/), the KV sizing (kv); and what else is derived from the config
alone: the Ansible inventory and the systemd unit.

Derivation only: nothing here changes a rank, reads a file, asks Docker or opens SSH; the
callers gather those inputs (launcher/gather/: one `Gathered` value) and pass them in.
May import `launcher.inputs`, `launcher.engines`, `launcher.facts` (their types and pure
parsers) and the gathered value's types (launcher/gather/value.py) only.
"""
