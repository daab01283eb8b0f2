"""Validated inputs beneath the plan: `cluster.yaml` (config), the serving profiles, vLLM 0.33's
option table and flag checks (vllm_flags, with its vendored data/), vLLM's startup memory guard,
the API key, and the one list of node settings a Spark needs.

Every problem is reported as `file: field.path: problem`. May import `launcher.errors`,
`launcher.redact`, `launcher.facts` (the model's shape), `launcher.engines` (what an engine
checks of a config, whether it checks an API key) and the sandbox's stdlib-only stand-in
parsers (`launcher.sandbox.standins`), nothing above.
"""
