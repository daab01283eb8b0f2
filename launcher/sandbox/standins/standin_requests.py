"""SANDBOX STAND-IN: what vLLM 0.33's OpenAI server refuses in a request, and the /v1/completions
bodies it answers with, for the vLLM stand-in (standin_vllm.py). Standard library only.

Every message, status, field and rule here was recorded from vLLM 0.33.0's own server code
(scripts/record_vllm_api.py -> tests/fixtures/vllm033_api/cases.json; tests/test_standin_api.py
compares): the order of the checks, the length rule (a prompt that alone exceeds the context is
refused; otherwise max_tokens is shortened to what is left, and 0 left is "max_tokens must be at
least 1"), max_tokens above the context refused whatever the prompt, logprobs capped at 20.
Completions run on standin_lm's byte-level model: usage counts its tokens, one per UTF-8 byte.
"""

from __future__ import annotations

import struct

import standin_lm as lm

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default vLLM keeps


class Refused(Exception):
    """A request vLLM answers with an error body; .status and .body are that answer."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": status}}


def invalid(message: str, param: str, value=None) -> Refused:
    """vLLM's VLLMValidationError: the parameter (and its value) appended to the message."""
    where = f"parameter={param}" + ("" if value is None else f", value={value}")
    return Refused(f"{message} ({where})", param=param)


INT_FIELDS = ("max_tokens", "max_completion_tokens", "logprobs", "prompt_logprobs")


def pydantic_int(field: str, value):
    """The request model's parsing of an integer field (pydantic, lax): whole floats and numeric
    strings are taken; anything else is FastAPI's 400 with pydantic's error."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            kind, msg = "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
    elif isinstance(value, float):
        kind, msg = "int_from_float", "Input should be a valid integer, got a number with a fractional part"
    else:
        kind, msg = "int_type", "Input should be a valid integer"
    error = {"type": kind, "loc": f"body.{field}", "msg": msg, "input": value}
    raise Refused(f"1 validation error:\n  {error}", kind="Bad Request", param=f"body.{field}")


def parsed(req: dict) -> dict:
    """The request with its integer fields as the request model parses them."""
    return {**req, **{f: pydantic_int(f, req[f]) for f in INT_FIELDS if f in req}}


def check_model(model, names: list[str]) -> None:
    if model and model not in names:
        raise Refused(f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                      404, "NotFoundError", "model")


def check_max_tokens_param(max_tokens, limit: int | None) -> None:
    """The renderer's check, before the prompt is tokenized: no more output than the context."""
    if limit and isinstance(max_tokens, int) and max_tokens > limit:
        raise invalid(f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. "
                      "Please request fewer output tokens.", "max_tokens", max_tokens)


def check_prompt_len(count: int, limit: int | None, from_text: bool) -> None:
    """A prompt that alone does not fit. vLLM's tokenizer stops a text at limit + 1 tokens, so a
    long text is reported as "at least limit + 1"; token ids are counted exactly."""
    if not limit or count <= limit:
        return
    shown = limit + 1 if from_text else count
    qualifier = "at least " if shown == limit + 1 else ""
    raise invalid(f"This model's maximum context length is {limit} tokens. However, your prompt "
                  f"contains {qualifier}{shown} input tokens, which exceeds this limit even "
                  "without any output tokens. Please reduce the length of the input prompt.",
                  "input_tokens", shown)


def effective_max_tokens(requested, prompt_len: int, limit: int | None, default: int | None) -> int:
    """vLLM's get_max_tokens, then SamplingParams' check: the smaller of what was asked (or the
    default) and what the context has left; below 1 is refused."""
    candidates = [v for v in (requested if requested is not None else default,
                              limit - prompt_len if limit else None) if v is not None]
    value = min(candidates) if candidates else None
    if value is not None and value < 1:
        raise invalid(f"max_tokens must be at least 1, got {value}.", "max_tokens", value)
    return value


def check_logprobs(req: dict) -> None:
    for param, what in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
        n = req.get(param)
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_LOGPROBS:
            raise invalid(f"Requested {what} logprobs of {n}, which is greater than max allowed: "
                          f"{MAX_LOGPROBS}", param, n)


def prompt_tokens(prompt) -> tuple[list[int], bool]:
    """The prompt's token ids, and whether they came from text."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        tokens, from_text = lm.encode(prompt), True
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens, from_text = list(prompt), False
    else:
        raise Refused("prompt must be a string or a list of token ids (SANDBOX STAND-IN: one "
                      "prompt per request)", param="prompt")
    if not tokens:
        raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    return tokens, from_text


def check_vocab(tokens: list[int]) -> None:
    for bad in (min(tokens), max(tokens)):
        if not 0 <= bad < lm.VOCAB:
            raise Refused(f"Token id {bad} is out of vocabulary")


def f32(x: float) -> float:
    """Logprobs come off the GPU as float32."""
    return struct.unpack("f", struct.pack("f", x))[0]


class Completion:
    """One /v1/completions request, checked as vLLM checks it (Refused otherwise), and the pieces
    of its answer: the generated tokens, their logprobs and the prompt's."""

    def __init__(self, req: dict, names: list[str], limit: int | None, model: lm.Model,
                 continuation: str):
        req = parsed(req)
        check_model(req.get("model"), names)
        check_max_tokens_param(req.get("max_tokens"), limit)
        self.prompt, from_text = prompt_tokens(req.get("prompt"))
        check_prompt_len(len(self.prompt), limit, from_text)
        self.max_tokens = effective_max_tokens(req.get("max_tokens"), len(self.prompt), limit,
                                               COMPLETION_DEFAULT_MAX_TOKENS)
        check_logprobs(req)
        if not from_text:
            check_vocab(self.prompt)
        self.req, self.model = req, model
        self.echo, self.k = bool(req.get("echo")), req.get("logprobs")
        self.continuation = continuation
        self.generate()

    def generate(self) -> None:
        out = self.model.continuation(self.prompt, self.continuation)
        self.tokens = out[:self.max_tokens]
        self.finish = "stop" if self.tokens[-1] == lm.EOS else "length"

    def corrupt(self, model: lm.Model) -> None:
        """Answer from `model` instead (the image's fault under concurrency: standin_vllm)."""
        self.model = model
        self.generate()

    @property
    def text_tokens(self) -> list[int]:
        """The generated tokens that show as text: bytes; specials (the end of text, a chat
        role a noisy model may emit) do not, as vLLM's default skip_special_tokens leaves them out."""
        return [t for t in self.tokens if t < 256]

    def _top(self, token: int, position: int, k: int) -> tuple[float, int, dict]:
        """(logprob, rank) of the token and vLLM's per-position dict: the token first, then top k."""
        k = lm.VOCAB if k == -1 else k
        logprob, rank, top = self.model.score(token, position, k)
        entries = {token: (f32(logprob), rank)}
        for r, (t, lp) in enumerate(top, 1):
            entries.setdefault(t, (f32(lp), r))
        return f32(logprob), rank, entries

    def prompt_logprobs(self, k: int) -> list:
        rows: list = [None]
        for p, t in enumerate(self.prompt[1:], 1):
            rows.append({str(tok): {"logprob": lp, "rank": r, "decoded_token": lm.piece(tok)}
                         for tok, (lp, r) in self._top(t, p, k)[2].items()})
        return rows

    def sample_logprobs(self, start: int, end: int, offset: int) -> dict:
        """choices[].logprobs for generated tokens [start, end), text offsets from `offset`."""
        lp: dict = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for i in range(start, end):
            token = self.tokens[i]
            logprob, _, entries = self._top(token, len(self.prompt) + i, self.k)
            text = lm.piece(token) if token != lm.EOS else ""
            lp["text_offset"].append(offset)
            lp["token_logprobs"].append(logprob)
            lp["tokens"].append(text if token != lm.EOS else lm.SPECIALS[0])
            lp["top_logprobs"].append({lm.piece(t): v for t, (v, _) in entries.items()})
            offset += len(text)
        return lp

    def echoed_logprobs(self) -> dict:
        """With echo, the prompt's tokens lead: null for the first, then the prompt logprobs."""
        lp: dict = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        offset = 0
        for p, token in enumerate(self.prompt):
            lp["text_offset"].append(offset)
            lp["tokens"].append(lm.piece(token))
            if p == 0:
                lp["token_logprobs"].append(None)
                lp["top_logprobs"].append(None)
            else:
                logprob, _, entries = self._top(token, p, self.k)
                lp["token_logprobs"].append(logprob)
                lp["top_logprobs"].append({lm.piece(t): v for t, (v, _) in entries.items()})
            offset += len(lm.piece(token))
        return lp


def usage(prompt: int, completion: int, details: bool = True) -> dict:
    body = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}
    if details:
        body.update(prompt_tokens_details=None, completion_tokens_details=None)
    return body
