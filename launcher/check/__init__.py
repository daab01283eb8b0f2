"""`sparkstack check`, pure judging over one gathered value (launcher/gather/): the rows, one
module per subject in rows/ (each row declared with its name, its order and the facts it reads;
rows/case.py is what a row reads, rows/drift.py the comparison across ranks), the report that
runs them in order (report: Report, evaluate, refuse for `up`), and the verdicts of the two
measurements `check` runs on request: the NCCL all-reduce (bandwidth: its jobs' commands, the
outcome parser, the judgement) and the checkpoint's hashes (hashes: judged against the manifest).
Pure, all of it: what runs on the ranks is launcher/gather/'s (the reads) and launcher/apply/'s
(the whole command, apply/preflight.py, and the all-reduce jobs, apply/bandwidth.py).

May import the plan, gather, images, transport, inputs, facts and onrank folders; never apply,
bench or cli.
"""
