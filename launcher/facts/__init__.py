"""What was read of the world, as typed, pure data: the probe's output parsed into Facts, each
rank's fabric derived from its own Facts, the checkpoint's shape and weight split from
`config.json` and the safetensors headers.

Pure parsers and derivations: no SSH, no Docker. May import `launcher.errors`, `launcher.status`
(fabric's findings) and `launcher.onrank` (the probe's invocation) only.
"""
