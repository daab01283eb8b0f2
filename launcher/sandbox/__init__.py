"""The sandbox cluster: four simulated DGX Spark ranks on the local Docker engine.

`cluster.up/down/status` do the work, with the ranks' fake hardware from fabric_fixture (sysfs,
cabling) and model_fixture (a small checkpoint), the Debian image from debian_image and the
stand-ins from standins/; `cli` is the `sparkstack sandbox` command group (the CLI names it
by its import string, launcher/cli/commands.py's table: nothing outside sandbox/ imports it).
chain_fixture holds the image chain's stand-in base and patch files, for tests/test_build.py and
scripts/bench_build.py alike.

May import `launcher.inputs`, `launcher.facts` and the top-level errors; of the cli only its
console (`cli`, for the command group's output).
"""
