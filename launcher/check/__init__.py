"""`sparkstack check`: the judged rows per rank (check) and the optional NCCL bandwidth probe
(bandwidth).

May import the plan, images, transport, inputs, facts and onrank folders; never apply, bench or cli.
"""
