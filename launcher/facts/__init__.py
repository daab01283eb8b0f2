"""What was read of the world, as typed, pure data: the probe's output parsed into Facts, each
rank's fabric derived from its own Facts, the checkpoint's shape and weight split from
`config.json` and the safetensors headers; image references split into their parts (image_ref);
the named facts `ship`, `build`, `serve` and `prep` read of a rank, each a shell command and
its parser (remote).

Pure parsers and derivations: no SSH, no Docker (remote's commands are run by the caller).
May import `launcher.errors`, `launcher.status` (fabric's findings) and `launcher.onrank` (the
probe's invocation) only.
"""
