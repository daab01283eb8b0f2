"""Reaching the ranks and the served API: where a rank's sshd is (target), SSH to every rank in
parallel (remote), each rank's value or exception from it (outcome), and the OpenAI-compatible
API on rank 0 (api). What is run on the ranks to plan and judge (the probe, the pings) is
launcher/gather/'s.

May import `launcher.inputs`, `launcher.facts`, `launcher.onrank` and the top-level errors.
"""
