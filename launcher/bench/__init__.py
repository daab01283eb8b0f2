"""`sparkstack bench`: the measurements against any OpenAI-compatible server (run: its inputs and
the HTTP client; its prompts in data/), the pure parts beside it (stats: the arithmetic, results:
what was measured, needle: the needle prompt, stream: one stream read), and what it hands back:
the table, the JSON and the plot (report).

May import `launcher.transport` (the API) and the top-level errors and status.
"""
