"""Reaching the ranks and the served API: where a rank's sshd is (target), SSH to every rank in
parallel (remote), each rank's value or exception from it (outcome), the one probe run on every
rank and parsed (gather), and the OpenAI-compatible API on rank 0 (api).

May import `launcher.inputs`, `launcher.facts`, `launcher.onrank` and the top-level errors.
"""
