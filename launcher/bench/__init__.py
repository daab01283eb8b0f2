"""`sparkstack bench`: the measurements against any OpenAI-compatible server (bench, its prompts
in data/) and what it hands back: the table, the JSON and the plot (bench_report).

May import `launcher.transport` (the API) and the top-level errors and status.
"""
