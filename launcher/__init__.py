"""sparkstack: bring one huge MoE model up on four DGX Spark boxes with vLLM TP4, again after every boot."""

__version__ = "0.1.0"
