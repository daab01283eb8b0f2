"""`sparkstack check`, pure judging over one gathered value (launcher/gather/): the rows, one
module per subject in rows/ (each row declared with its name, its order and the facts it reads;
rows/case.py is what a row reads, rows/drift.py the comparison across ranks), the report that
runs them in order (report: Report, evaluate, refuse for `up`), and the whole command
(preflight: gather, evaluate, and on request the NCCL bandwidth probe (bandwidth) and the
checkpoint's hashes (hashes), which measure on the ranks themselves).

May import the plan, gather, images, transport, inputs, facts and onrank folders; never apply,
bench or cli.
"""
