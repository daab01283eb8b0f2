"""`sparkstack bench`: the measurements against any OpenAI-compatible server (run, its prompts
in data/) and what it hands back: the table, the JSON and the plot (report).

May import `launcher.transport` (the API) and the top-level errors and status.
"""
