"""Validated inputs beneath the plan: `cluster.yaml` (config), the serving profiles, vLLM 0.33's
option table and flag checks (vllm_flags, with its vendored data/; vLLM's value parsers in
vllm_options, stdlib-only and importing nothing of the kit, since the sandbox's stand-in `vllm`
carries a copy), vLLM's startup memory guard, the API key, and the one list of node settings a
Spark needs.

Every problem is reported as `file: field.path: problem`. May import the package's root
modules (`launcher.errors`, `redact`, `resources`), `launcher.facts` (the model's shape) and
`launcher.engines` (what an engine checks of a config, whether it checks an API key), nothing above.
"""
