"""The sandbox's stand-ins for `vllm`, `ray`, torch.distributed's rendezvous and TensorFold's
server (clearly named: not the real ones). Copied into the sandbox's Debian image and run there
by its python3, so each is stdlib-only and imports nothing from `launcher`
(tests/test_layers.py keeps it so). They import one another, and the kit's stdlib-only
`launcher/inputs/vllm_options.py` (vLLM's value parsers), as siblings: the image installs them
side by side in dist-packages (launcher/sandbox/debian_image.py).
"""
