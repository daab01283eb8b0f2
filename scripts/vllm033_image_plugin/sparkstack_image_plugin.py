"""NOT the serving images' plugins: a vLLM general plugin that registers, through vLLM's own
registration calls, the names the seeds' images register, so scripts/check_engine_config_with_vllm.py
can ask real vLLM 0.33 about the kit's argv "on an image that brings X" (stand-in for the images'
real overlays/plugins, which this machine does not have). Which names: SPARKSTACK_IMAGE_REGISTERS,
the kit's capability names, comma-separated (quantization:exl3, attention:sparse-mla-dcp,
attention:CUSTOM). Loaded by vllm.plugins.load_general_plugins() from the entry point in
sparkstack_image_plugin-0.dist-info (this folder on sys.path)."""

import os


def register():
    wanted = {c.strip() for c in os.environ.get("SPARKSTACK_IMAGE_REGISTERS", "").split(",") if c.strip()}
    if "quantization:exl3" in wanted:
        _exl3()
    if "attention:sparse-mla-dcp" in wanted:
        # the dcp stage's SM120 sparse-MLA port: the GB10 sparse backend with DCP
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120.get_class().get_impl_cls().supports_dcp = True
    if "attention:CUSTOM" in wanted:
        # Pollard's plugin: a GB10 sparse-MLA backend under CUSTOM (here vLLM's own SM120 one)
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        register_backend(AttentionBackendEnum.CUSTOM, AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120.get_path())


def _exl3():
    import torch
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    @register_quantization_config("exl3")
    class Exl3Config(QuantizationConfig):
        """Configuration only (the image's EXL3 kernels are not here)."""

        def get_name(self):
            return "exl3"

        def get_supported_act_dtypes(self):
            return [torch.bfloat16, torch.float16]

        @classmethod
        def get_min_capability(cls):
            return 80

        @staticmethod
        def get_config_filenames():
            return []

        @classmethod
        def from_config(cls, config):
            return cls()

        def get_quant_method(self, layer, prefix):
            return None
