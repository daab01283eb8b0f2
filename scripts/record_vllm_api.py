#!/usr/bin/env python3
"""Record vLLM 0.33's own OpenAI server answering the cases the sandbox stand-in must answer alike.

Needs vLLM installed (CPU is enough); not a test. Writes tests/fixtures/vllm033_api/*.json, which
tests/test_standin_api.py compares the stand-in's answers with:

    /work/vllm033/venv/bin/python scripts/record_vllm_api.py [--out tests/fixtures/vllm033_api]

What runs is vLLM's own code from the HTTP request to the response body: `vllm serve`'s argument
parser and engine configuration, its FastAPI app (build_app, init_app_state: routers, error
handlers, the serving classes, renderer, pydantic models) and its AsyncLLM (input processor,
output processor, detokenizer, logprobs). Only the engine core is faked (no GPU, no weights): it
"generates" with the stand-in's own small model (launcher/sandbox/standins/standin_lm.py), whose
byte-level vocabulary is the Hugging Face tokenizer built here. So for the same prompt the
stand-in must give the same tokens, text and logprobs as vLLM does here. Every completions body is
validated against vLLM's CompletionResponse (and each stream chunk against its stream model).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "launcher" / "sandbox" / "standins"
MAX_MODEL_LEN = 1000


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, STANDINS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lm = load("standin_lm")
standin = load("standin_vllm")

# config.json of the tiny checkpoint (no weights are read); the stand-in's test writes the same one,
# so both seed standin_lm's model alike.
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
          "num_hidden_layers": 2, "vocab_size": lm.VOCAB, "max_position_embeddings": 4096,
          "eos_token_id": lm.EOS, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character map, which the ByteLevel pre-tokenizer uses."""
    bs = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_checkpoint(where: Path) -> None:
    """config.json and a tokenizer whose ids are standin_lm's: byte b is token b, then SPECIALS."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(CONFIG, sort_keys=True))
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in bytes_to_unicode().items()}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in lm.SPECIALS[:3]])
    tok.add_tokens([AddedToken(s, special=False) for s in lm.SPECIALS[3:]])
    assert tok.encode("a<think>").ids == [97, 259], tok.encode("a<think>").ids
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": lm.SPECIALS[0],
        "model_max_length": 4096, "chat_template": CHAT_TEMPLATE}))


def generated(prompt: list[int]) -> list[int]:
    """What the fake engine writes: for a chat prompt (it ends with <|assistant|>) the stand-in's
    thinking then its answer; for a completion the stand-in's answer text (standin_vllm.ANSWER)."""
    answer = " ".join(standin.ANSWER)
    if prompt and prompt[-1] == 258:
        return [259, *lm.encode(" ".join(standin.REASONING[:4])), 260, *lm.encode(answer[:40])]
    return lm.encode(answer)


class FakeCore:
    """The engine core AsyncLLM talks to, in process: one token per step per request, with
    standin_lm's logprobs where the request asks for them."""

    engine_ranks_managed = [0]

    def __init__(self, seed: int):
        import torch  # noqa: F401 (LogprobsTensors are torch tensors)

        self.model = lm.Model(seed)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.resources = type("Resources", (), {"engine_dead": False})()

    async def get_supported_tasks_async(self):
        return ("generate",)

    def dp_engines_running(self) -> bool:
        return False

    def shutdown(self, timeout=None) -> None:
        pass

    async def abort_requests_async(self, request_ids) -> None:
        pass

    async def add_request_async(self, request) -> None:
        asyncio.get_running_loop().create_task(self.run(request))

    async def get_output_async(self):
        return await self.queue.get()

    def _row(self, token: int, position: int, k: int):
        logprob, rank, top = self.model.score(token, position, k)
        return [token, *(t for t, _ in top)], [logprob, *(lp for _, lp in top)], rank

    async def run(self, request) -> None:
        import numpy as np
        import torch
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
        from vllm.v1.outputs import LogprobsLists, LogprobsTensors

        sp, prompt = request.sampling_params, request.prompt_token_ids
        out = generated(prompt)
        n = min(sp.max_tokens, len(out) + 1)  # + the end-of-text token
        tokens = (out + [lm.EOS])[:n]
        for i, token in enumerate(tokens):
            extra = {}
            if i == 0 and sp.prompt_logprobs is not None:
                k = lm.VOCAB if sp.prompt_logprobs == -1 else sp.prompt_logprobs
                rows = [self._row(t, p, k) for p, t in enumerate(prompt) if p > 0]
                extra["new_prompt_logprobs_tensors"] = LogprobsTensors(
                    torch.tensor([r[0] for r in rows]),
                    torch.tensor([r[1] for r in rows], dtype=torch.float32),
                    torch.tensor([r[2] for r in rows]))
            if sp.logprobs is not None:
                k = lm.VOCAB if sp.logprobs == -1 else sp.logprobs
                ids, lps, rank = self._row(token, len(prompt) + i, k)
                extra["new_logprobs"] = LogprobsLists(np.array([ids]), np.array([lps], np.float32),
                                                      np.array([rank]))
            last = i == n - 1
            finish = (FinishReason.STOP if token == lm.EOS else FinishReason.LENGTH) if last else None
            await self.queue.put(EngineCoreOutputs(outputs=[EngineCoreOutput(
                request_id=request.request_id, new_token_ids=[token], finish_reason=finish,
                **extra)]))
            await asyncio.sleep(0)


def serve_args(model: Path, extra: list[str]):
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return parser.parse_args(["--model", str(model), "--max-model-len", str(MAX_MODEL_LEN),
                              "--served-model-name", "glm", "--disable-log-stats", *extra])


async def server(model: Path, extra: list[str]):
    """vLLM's app and AsyncLLM over FakeCore, as `vllm serve MODEL --max-model-len 1000 ...`."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.v1.engine import core_client
    from vllm.v1.engine.async_llm import AsyncLLM

    args = serve_args(model, extra)
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    seed = lm.checkpoint_seed((model / "config.json").read_bytes())
    core_client.EngineCoreClient.make_async_mp_client = staticmethod(lambda **kw: FakeCore(seed))
    engine = AsyncLLM.from_vllm_config(config, disable_log_stats=True)
    tasks = await engine.get_supported_tasks()
    app = build_app(args, tasks, config.model_config)
    await init_app_state(engine, app.state, args, tasks)
    return app


# name -> (path, body): each case once per server; "stream" bodies are read as SSE.
PROMPT = "The sky was grey and the sea was calm."
CASES = {
    "completion_prompt_logprobs": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 5, "logprobs": 2, "prompt_logprobs": 1}),
    "completion_echo_logprobs": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 1}),
    "completion_token_ids_prompt_logprobs_0": ("/v1/completions", {
        "model": "glm", "prompt": lm.encode("Four small"), "max_tokens": 1, "prompt_logprobs": 0}),
    "completion_stop_at_eos": ("/v1/completions", {
        "model": "glm", "prompt": "Hi", "max_tokens": 400}),
    "completion_stream": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 3, "logprobs": 1, "stream": True,
        "stream_options": {"include_usage": True}}),
    "completion_max_tokens_0": ("/v1/completions", {"model": "glm", "prompt": PROMPT, "max_tokens": 0}),
    "completion_shortened_to_context": ("/v1/completions", {
        "model": "glm", "prompt": "x" * 990, "max_tokens": 100}),
    "completion_prompt_too_long": ("/v1/completions", {
        "model": "glm", "prompt": "x" * 1001, "max_tokens": 5}),
    "completion_prompt_far_too_long": ("/v1/completions", {
        "model": "glm", "prompt": "x" * 1500, "max_tokens": 5}),
    "completion_token_ids_too_long": ("/v1/completions", {
        "model": "glm", "prompt": [120] * 1001, "max_tokens": 5}),
    "completion_default_max_tokens": ("/v1/completions", {"model": "glm", "prompt": PROMPT}),
    "completion_logprobs_too_many": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 1, "logprobs": 50}),
    "completion_max_tokens_not_int": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": "many"}),
    "completion_prompt_fills_context": ("/v1/completions", {
        "model": "glm", "prompt": "x" * 1000, "max_tokens": 5}),
    "completion_max_tokens_above_context": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 2000}),
    "completion_prompt_logprobs_too_many": ("/v1/completions", {
        "model": "glm", "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 50}),
    "completion_empty_prompt": ("/v1/completions", {"model": "glm", "prompt": "", "max_tokens": 1}),
    "completion_token_id_out_of_vocab": ("/v1/completions", {
        "model": "glm", "prompt": [70, 5000], "max_tokens": 1}),
    "completion_unknown_model": ("/v1/completions", {"model": "other", "prompt": "Hi", "max_tokens": 1}),
    "chat": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 60}),
    "chat_stream": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 60,
        "stream": True, "stream_options": {"include_usage": True}}),
    "chat_max_tokens_0": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 0}),
    "chat_max_tokens_not_int": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": "many"}),
    "chat_shortened_to_context": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": "x" * 970}], "max_tokens": 100}),
    "chat_prompt_too_long": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": "x" * 1001}], "max_tokens": 5}),
    "chat_max_tokens_above_context": ("/v1/chat/completions", {
        "model": "glm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2000}),
}
# The same chat cases again on a server with --reasoning-parser (GLM's): where thinking goes.
REASONING_CASES = ("chat", "chat_stream")


async def record(app, names, suffix: str, out: dict) -> None:
    import httpx
    from vllm.entrypoints.openai.completion.protocol import (CompletionResponse,
                                                             CompletionStreamResponse)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
        for name in names:
            path, body = CASES[name]
            r = await client.post(path, json=body)
            if body.get("stream") and r.status_code == 200:
                events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
                answer = [e if e == "[DONE]" else json.loads(e) for e in events]
                if path == "/v1/completions":
                    for chunk in answer[:-1]:
                        CompletionStreamResponse.model_validate(chunk)
            else:
                answer = r.json()
                if path == "/v1/completions" and r.status_code == 200:
                    CompletionResponse.model_validate(answer)
            out[name + suffix] = {"request": {"path": path, "body": body},
                                  "status": r.status_code, "response": answer}
            print(f"{name + suffix}: {r.status_code}", file=sys.stderr)


def standin_answers(model: Path, extra: list[str]) -> dict:
    """The stand-in (a real process on loopback) asked the same cases; the chat bodies as the
    stand-in's tests send them (thinking on, so reasoning shows)."""
    import os
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request

    (model / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    meminfo = model.parent / "meminfo"
    meminfo.write_text("MemTotal: 127600000 kB\nMemFree: 127600000 kB\nMemAvailable: 127600000 kB\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(ROOT / "launcher/inputs/data/vllm-serve-flags-0.33.json"),
           "SANDBOX_VLLM_RECORD": str(model.parent / "record.json"), "SANDBOX_VLLM_MEMINFO": str(meminfo),
           "SANDBOX_VLLM_HELD_GIB": "0", "SANDBOX_VLLM_TOKENS_PER_S": "5000", "SANDBOX_VLLM_TTFT_S": "0"}
    proc = subprocess.Popen([sys.executable, str(STANDINS / "standin_vllm.py"), "serve", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len",
                             str(MAX_MODEL_LEN), "--served-model-name", "glm", *extra],
                            env=env, stderr=subprocess.DEVNULL)
    answers: dict = {}
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        for name, (path, body) in CASES.items():
            if path.endswith("chat/completions"):
                body = {**body, "chat_template_kwargs": {"reasoning_effort": "high"}}
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode())
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status, raw = resp.status, resp.read().decode()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read().decode()
            except OSError as e:  # the stand-in dropped the connection: a finding, not a crash here
                answers[name] = (0, {"no answer": str(e)})
                continue
            if body.get("stream") and status == 200:
                answers[name] = (status, [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:])
                                          for e in raw.splitlines() if e.startswith("data: ")])
            else:
                answers[name] = (status, json.loads(raw))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return answers


def validate_standin(answers: dict) -> list[str]:
    """Each stand-in answer through vLLM's own response models; the problems found."""
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import (ChatCompletionResponse,
                                                                  ChatCompletionStreamResponse)
    from vllm.entrypoints.openai.completion.protocol import (CompletionResponse,
                                                             CompletionStreamResponse)
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    problems = []
    for name, (status, body) in answers.items():
        chat = CASES[name][0].endswith("chat/completions")
        try:
            assert status, body
            if status != 200:
                ErrorResponse.model_validate(body)
            elif isinstance(body, list):
                model = ChatCompletionStreamResponse if chat else CompletionStreamResponse
                for chunk in body[:-1]:
                    model.model_validate(chunk)
                assert body[-1] == "[DONE]"
            else:
                (ChatCompletionResponse if chat else CompletionResponse).model_validate(body)
        except (ValidationError, AssertionError) as e:
            problems.append(f"{name}: {e}")
    return problems


async def main_async(out_dir: Path) -> None:
    import vllm
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()  # no GPU here; the API layer is the same
    recorded: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        write_checkpoint(model)
        await record(await server(model, []), list(CASES), "", recorded)
        await record(await server(model, ["--reasoning-parser", "glm45"]), REASONING_CASES,
                     "_reasoning_parser", recorded)
        answers = standin_answers(model, [])
    problems = validate_standin(answers)
    other = [f"{n} ({status}, vLLM {recorded[n]['status']})" for n, (status, _) in answers.items()
             if status != recorded[n]["status"]]
    # chat prompts are counted differently (the stand-in: 1.3 a word; here: a byte a token), so
    # chat_prompt_too_long's one long word fits the stand-in: its test sends 1,000 words instead
    print(f"stand-in: {len(answers) - len(other)}/{len(answers)} cases with vLLM's status "
          f"(others: {', '.join(other) or 'none'}); every body through vLLM's response models: "
          f"{'; '.join(problems) or 'all valid'}", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"vllm_version": vllm.__version__, "produced_by": "scripts/record_vllm_api.py",
            "serve": f"vllm serve MODEL --max-model-len {MAX_MODEL_LEN} --served-model-name glm",
            "config_json": json.dumps(CONFIG, sort_keys=True), "chat_template": CHAT_TEMPLATE,
            "note": "ids, created times and system_fingerprint (its hash covers the temporary "
                    "model path) differ per run; the stand-in's tests ignore them"}
    (out_dir / "cases.json").write_text(json.dumps({"meta": meta, "cases": recorded}, indent=1,
                                                   sort_keys=True) + "\n")
    print(f"wrote {out_dir / 'cases.json'} ({len(recorded)} cases)", file=sys.stderr)
    if problems:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "vllm033_api")
    asyncio.run(main_async(ap.parse_args().out))


if __name__ == "__main__":
    main()
