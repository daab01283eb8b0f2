"""SANDBOX STAND-IN language model behind the vLLM stand-in's /v1/completions: NOT a model of any
checkpoint. It tokenizes text byte by byte and scores each token with a small fixed model, so that
prompt logprobs (a teacher-forced perplexity, #30) are deterministic: the same text on the same
checkpoint gives the same logprobs, and English scores better than noise. Standard library only.

- Vocabulary: token id = the UTF-8 byte (0-255), then SPECIALS (end of text, chat roles, the
  thinking tags). scripts/record_vllm_api.py builds a Hugging Face tokenizer with exactly these
  ids, so vLLM 0.33's own server, run over this model, answers what the stand-in answers.
- Model: unigram. Each position ranks the vocabulary in one fixed order (English letter
  frequency; the checkpoint's identity swaps a few neighbours), and rank r has probability
  1 / (r * H) (Zipf; H normalises over the vocabulary), so top-k is the first k of the order.
- `noise=True` is the seam for a broken image (an overlay that corrupts the logits): every
  position then ranks the vocabulary in its own pseudo-random order, so real text scores like
  random bytes, and greedy generation emits the top of that order: gibberish.
- Greedy generation (`continuation`): a few skills stand for what a real model knows, so that
  `sparkstack verify`'s probes have something to be right or wrong about: continuing a counted
  sequence, simple arithmetic, a few facts, and completing `return` of a documented two-argument
  function. Anything else continues with the caller's canned text, as before.
"""

from __future__ import annotations

import hashlib
import math
import re

SPECIALS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<think>", "</think>")
EOS = 256
VOCAB = 256 + len(SPECIALS)
# The order a unigram model of English prose ranks bytes in (most likely first).
PREFERRED = (" etaoinshrdlcumwfgypbvkjxqz" + "ETAOINSHRDLCUMWFGYPBVKJXQZ" + ".,'\n-\"0123456789?!:;()")
ZIPF_H = sum(1.0 / r for r in range(1, VOCAB + 1))


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def piece(token: int) -> str:
    """What one token decodes to alone, as vLLM's detokenizer shows it: a special's name, an
    ASCII byte's character, and U+FFFD for a byte that is only part of a character."""
    if token >= 256:
        return SPECIALS[token - 256]
    return bytes([token]).decode("utf-8", errors="replace")


# What the stand-in "knows": (a question's pattern at the end of the prompt, the answer).
FACTS = (
    (re.compile(r"capital of France\b.*$", re.S | re.I), " Paris."),
    (re.compile(r"capital of Japan\b.*$", re.S | re.I), " Tokyo."),
    (re.compile(r"largest planet\b.*$", re.S | re.I), " Jupiter."),
)
COUNTING = re.compile(r"(-?\d+)(?:,\s*(-?\d+)){2,},?\s*$")
ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)\s*(?:=|\?\s*\n?A:)\s*$")
CODE = re.compile(r"def \w+\((\w+), (\w+)\):\s*\"\"\"Return the (sum|product|difference) of \w+ and \w+\.?"
                  r"\"\"\"\s*return\s*$")
OPERATOR = {"sum": "+", "product": "*", "difference": "-"}


def answer(text: str) -> str | None:
    """The stand-in model's greedy answer to `text`, where one of its skills applies."""
    m = COUNTING.search(text)
    if m:
        numbers = [int(n) for n in re.findall(r"-?\d+", m.group(0))]
        step = numbers[-1] - numbers[-2]
        if all(b - a == step for a, b in zip(numbers, numbers[1:])):
            nxt = [numbers[-1] + step * i for i in (1, 2, 3)]
            return (" " if text.endswith(",") else "") + ", ".join(map(str, nxt)) + ","
    m = ARITHMETIC.search(text)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return f" {a + b if op == '+' else a - b if op == '-' else a * b}"
    m = CODE.search(text)
    if m:
        return f" {m.group(1)} {OPERATOR[m.group(3)]} {m.group(2)}\n"
    for pattern, said in FACTS:
        if pattern.search(text[-200:]):
            return said
    return None


def checkpoint_seed(config_bytes: bytes) -> int:
    """The checkpoint's identity: its config.json, hashed."""
    return int.from_bytes(hashlib.sha256(config_bytes).digest()[:8], "big")


def logprob_of_rank(rank: int) -> float:
    return -math.log(rank * ZIPF_H)


class Model:
    def __init__(self, seed: int, noise: bool = False):
        order = [ord(c) for c in PREFERRED] + sorted(set(range(VOCAB)) - {ord(c) for c in PREFERRED})
        for i in range(0, 24, 2):  # the checkpoint's identity: some neighbours swapped
            if seed >> i & 1:
                order[i], order[i + 1] = order[i + 1], order[i]
        self.order, self.seed, self.noise = order, seed, noise
        self.rank = {t: r for r, t in enumerate(order, 1)}

    def _order_at(self, position: int) -> list[int]:
        if not self.noise:
            return self.order
        key = f"{self.seed}:{position}".encode()
        return sorted(range(VOCAB), key=lambda t: hashlib.blake2b(key + t.to_bytes(2, "big"),
                                                                   digest_size=4).digest())

    def continuation(self, prompt: list[int], default: str, n: int = 32) -> list[int]:
        """Greedy generation after `prompt`, ending with EOS: what the model's skills answer (else
        `default`); with noise, the top token of each position's scrambled order."""
        if self.noise:
            return [self._order_at(len(prompt) + i)[0] for i in range(n)] + [EOS]
        text = bytes(t for t in prompt if t < 256).decode("utf-8", errors="replace")
        said = answer(text)
        return encode(default if said is None else said) + [EOS]

    def score(self, token: int, position: int, k: int) -> tuple[float, int, list[tuple[int, float]]]:
        """(logprob, rank) of `token` at `position`, and the k most likely (token, logprob)."""
        order = self._order_at(position)
        rank = order.index(token) + 1 if self.noise else self.rank[token]
        top = [(t, logprob_of_rank(r)) for r, t in enumerate(order[:k], 1)]
        return logprob_of_rank(rank), rank, top
