"""Reading one streamed chat completion: the SSE lines folded into a Request (pure: each line's
arrival time is passed in), and the error text of any OpenAI/vLLM/FastAPI error body."""

from __future__ import annotations

import json

from ..errors import SparkstackError
from .results import Request

REASONING_FIELDS = ("reasoning", "reasoning_content")  # vLLM 0.33 (with --reasoning-parser), older servers


class BenchError(SparkstackError):
    """The server could not be measured: unreachable, refused, or answered nonsense."""


class StreamReader:
    """Folds the SSE lines of one chat-completion stream into a Request. Pure: the arrival time
    of each line is passed in."""

    def __init__(self, started: float, where: str):
        self.started, self.where = started, where
        self.first_token_at: float | None = None
        self.ended_at: float | None = None
        self.done = False
        self.usage: dict | None = None
        self.chunks_with_text = 0
        self.finish_reason: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []

    def feed(self, line: str, now: float) -> None:
        line = line.strip()
        if not line.startswith("data:"):
            return  # blank separators, `event:`, `: keep-alive` comments
        data = line[5:].strip()
        self.ended_at = now
        if data == "[DONE]":
            self.done = True
            return
        chunk = self._parse(data)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk["choices"]:
            self._choice(choice, data, now)

    def _parse(self, data: str) -> dict:
        shown = data if len(data) <= 160 else data[:160] + "…"
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as e:
            raise BenchError(f"{self.where} sent a malformed stream chunk (not JSON: {e.msg}): "
                             f"data: {shown}") from None
        if isinstance(chunk, dict) and "error" in chunk:
            raise BenchError(f"{self.where} reported an error mid-stream: {error_text(chunk)}")
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            raise BenchError(f"{self.where} sent a stream chunk without a `choices` list: "
                             f"data: {shown}")
        return chunk

    def _choice(self, choice, data: str, now: float) -> None:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            raise BenchError(f"{self.where} sent a choice without a `delta` object: data: "
                             f"{data[:160]}")
        text = delta.get("content") or ""
        thought = next((delta[k] for k in REASONING_FIELDS if delta.get(k)), "")
        if not isinstance(text, str) or not isinstance(thought, str):
            raise BenchError(f"{self.where} sent non-text content in a delta: data: {data[:160]}")
        if text or thought:
            self.chunks_with_text += 1
            if self.first_token_at is None:
                self.first_token_at = now
        self.content.append(text)
        self.reasoning.append(thought)
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def result(self) -> Request:
        if not self.done and self.finish_reason is None:
            raise BenchError(f"{self.where} ended the stream before the reply was complete "
                             "(no finish_reason, no [DONE])")
        end = self.ended_at if self.ended_at is not None else self.started
        usage = self.usage or {}
        tokens = usage.get("completion_tokens")
        return Request(
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.started,
            wall_s=end - self.started,
            completion_tokens=tokens if isinstance(tokens, int) else self.chunks_with_text,
            prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int)
            else None,
            tokens_from="usage" if isinstance(tokens, int) else "chunks",
            finish_reason=self.finish_reason,
            content="".join(self.content), reasoning="".join(self.reasoning))


def error_text(body) -> str:
    """The message of an OpenAI/vLLM/FastAPI error body, whatever its shape."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err is not None:
            return str(err)
    return str(body)[:300]
