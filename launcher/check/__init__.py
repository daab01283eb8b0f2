"""`sparkstack check`: the judged rows per rank (check) and the optional NCCL bandwidth probe
(bandwidth) and checkpoint hashes (hashes). What the rows judge is gathered beforehand
(launcher/gather/: one `Gathered` value).

May import the plan, gather, images, transport, inputs, facts and onrank folders; never apply,
bench or cli.
"""
