"""The sandbox cluster: four simulated DGX Spark ranks on the local Docker engine.

`cluster.up/down/status` do the work; `cli.sandbox` is the `sparkstack sandbox` command group.
"""
