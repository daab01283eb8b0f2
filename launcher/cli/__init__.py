"""The command line (`sparkstack`, commands.main) and the only place that prints: where output
goes and how errors are shown (console), and the `sparkstack sandbox` group (sandbox).

May import every folder; nothing imports it.
"""
