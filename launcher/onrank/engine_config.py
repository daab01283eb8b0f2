"""check's engine row: the serving image's own engine configures the planned argv, no weights.

Run INSIDE the serving image on rank 0 (`docker run --rm --network none --gpus all -v
<checkpoint>:<checkpoint>:ro -e <the plan's env> <image> python3 - '<json>'`, this file on
stdin), with `{"argv": [<the tokens after `vllm serve`>]}`. It asks vLLM what `vllm serve`
would ask it before loading a byte, and nothing more:

1. the argument parser of `vllm serve` (vllm/entrypoints/common/cli_args.py make_arg_parser on
   a FlexibleArgumentParser, the model positional as `model_tag`), after the image's plugins
   are loaded (vllm.plugins.load_general_plugins: the image's quantization methods, attention
   backends);
2. `AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=OPENAI_API_SERVER)`,
   as `vllm serve` calls it: the checkpoint's config.json
   read, the derived max length, the quantization method, the parallel layout and executor
   (Ray imported for the Ray executor);
3. for an MLA model, the attention backend its layers would pick
   (vllm.v1.attention.selector.get_attn_backend under the configuration).

No KV cache, no weights, no NCCL: seconds. Where the image's `vllm` is the sandbox's stand-in
(no `vllm.engine`), its `standin_vllm.validate` runs the stand-in's same checks instead.

Output: the last line is `ENGINECONF OK <summary>` or `ENGINECONF FAIL <message as JSON>`;
exit 0 either way when the question could be asked (2: the argv did not parse, as vLLM exits).
"""

import json
import sys


def real_vllm(argv):
    import contextlib
    import io

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.plugins import load_general_plugins
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    load_general_plugins()
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 2), err.getvalue().strip().splitlines()[-1:] or ["argument error"]
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    try:
        # as `vllm serve` asks it (vllm/entrypoints/cli/serve.py): the API server's usage context
        # picks the batch defaults (on a GB10: --max-num-batched-tokens 2048)
        headless = {"headless": True} if getattr(args, "headless", False) else {}
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER, **headless)
        mc = config.model_config
        if mc.use_mla:
            from vllm.config import set_current_vllm_config
            from vllm.v1.attention.selector import get_attn_backend

            with set_current_vllm_config(config):
                get_attn_backend(mc.get_head_size(), mc.dtype, config.cache_config.cache_dtype,
                                 use_mla=True, use_sparse=hasattr(mc.hf_text_config, "index_topk"),
                                 num_heads=mc.get_num_attention_heads(config.parallel_config))
    except Exception as e:  # vLLM's refusals are ValueErrors; anything else is as telling
        return 1, [refusal(e)]
    return 0, [f"max_model_len={mc.max_model_len} quantization={mc.quantization}"]


def refusal(error):
    """vLLM's own words for a refusal. Its config classes are pydantic dataclasses: a ValueError
    raised while ModelConfig or ParallelConfig validates arrives wrapped in pydantic's
    ValidationError ("1 validation error for ModelConfig\n  Value error, <vLLM's message>
    [type=value_error, input_value=ArgsKwargs(...)]"); the error vLLM raised is in its ctx."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            found = [e.get("ctx", {}).get("error") for e in errors()]
        except Exception:  # not pydantic's errors(): said as it is
            found = []
        inner = next((e for e in found if isinstance(e, BaseException)), None)
        if inner is not None:
            return f"{type(inner).__name__}: {inner}"
    return f"{type(error).__name__}: {error}"


def _asked(question, argv):
    try:
        return question(argv)
    except Exception as e:  # the question itself broke: said as the answer, not as a traceback
        return 1, [f"the engine configuration could not be asked: {type(e).__name__}: {e}"]


def main():
    request = json.loads(sys.argv[1])
    argv = list(request["argv"])
    try:
        import vllm.engine  # noqa: F401  (the stand-in's vllm package has no engine)
    except ImportError:
        try:
            import standin_vllm
        except ImportError as e:
            print("ENGINECONF FAIL " + json.dumps(f"the image's python3 has no vLLM ({e})"))
            return 0
        code, lines = _asked(standin_vllm.validate, argv)
    else:
        code, lines = _asked(real_vllm, argv)
    print(("ENGINECONF OK " if code == 0 else "ENGINECONF FAIL ") + json.dumps("\n".join(lines)))
    return 2 if code == 2 else 0


if __name__ == "__main__":
    sys.exit(main())
