"""`sparkstack check`: the judged rows per rank (check) and the optional NCCL bandwidth probe
(bandwidth), and what this host reads for the plan (plan_inputs: the checkpoint, the serving
image's tag, the API key), so that launcher/plan/ stays pure.

May import the plan, images, transport, inputs, facts and onrank folders; never apply, bench or cli.
"""
