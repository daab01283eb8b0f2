"""The sandbox's stand-ins for `vllm`, `ray`, torch.distributed's rendezvous and TensorFold's
server (clearly named: not the real ones). Copied into the sandbox's Debian image and run there
by its python3, so each is stdlib-only and imports nothing from `launcher`
(tests/test_layers.py keeps it so); `launcher.inputs.vllm_flags` shares standin_vllm's value
parsers.
"""
