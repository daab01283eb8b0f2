"""The command line (`sparkstack`, commands.main) and the only place that prints. One module per
command (its options, one call into the layers below, its renderer), named in commands.COMMANDS
by "module:attribute" and imported only when run or listed; shared.py holds the common options,
`with_cluster` and the per-rank table; console.py where output goes and how errors show. The
`sparkstack sandbox` group lives in launcher/sandbox/cli.py, named there by its import string.

May import every folder but sandbox/; nothing imports it but sandbox/cli.py (its console).
"""
