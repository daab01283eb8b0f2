"""The needle prompt: a long filler journal with one fact hidden at a depth, and the question
that asks for it back. Pure; sized in words (TOKENS_PER_WORD), the server's usage gives the truth."""

from __future__ import annotations

import random

TOKENS_PER_WORD = 1.3  # English prose through a BPE tokenizer, for sizing needle prompts only


FILLER = [
    "The morning tide came in slowly over the flat grey sand.",
    "A pair of oystercatchers worked the edge of the water without hurry.",
    "Someone had left a blue rowing boat pulled high above the wrack line.",
    "By noon the wind had turned and carried the smell of cut hay from the fields inland.",
    "The harbour master walked the length of the quay and counted the moorings twice.",
    "Gulls argued over the remains of a crab on the slipway.",
    "In the village the baker sold the last of the rye loaves before eleven.",
    "A tractor crossed the causeway towing a trailer of seaweed for the gardens.",
    "Clouds built over the headland and then thinned without any rain.",
    "The ferry was late again because of a fault in its steering gear.",
    "Children collected smooth stones and lined them up along the sea wall.",
    "An old man repaired a lobster pot with orange twine and a wooden netting tool.",
    "The church clock ran four minutes slow, as it had done all summer.",
    "Late in the afternoon the light turned the wet sand the colour of brass.",
    "A heron stood in the shallows of the estuary for the better part of an hour.",
    "The shop on the corner put out a board advertising fresh mackerel.",
    "Two walkers asked the way to the standing stones and were sent up the lane.",
    "Evening brought a swell from the west and the boats rode it at anchor.",
    "The lamp in the lighthouse was lit at dusk and turned all night.",
    "Nothing else of note happened on the island that day.",
]
INTRO = ("Below is a long journal of ordinary days on a small island. One sentence in it states "
         "a fact that you will be asked about afterwards.")
QUESTION = "What is the secret code for the east vault? Reply with the code only."
WORDS = ["KESTREL", "ORCHID", "GRANITE", "LANTERN", "MARIGOLD", "TIMBER", "FALCON", "SAFFRON"]


def needle_fact(rng: random.Random) -> tuple[str, str]:
    """(the sentence to hide, the answer expected back): unique per request, so a cached or
    memorised reply cannot pass."""
    answer = f"{rng.randint(1000, 9999)}-{rng.choice(WORDS)}"
    return f"The secret code for the east vault is {answer}.", answer


def needle_messages(tokens: int, position: float, fact: str, nonce: int = 0) -> list[dict]:
    """A user message of about `tokens` tokens: filler sentences with `fact` at `position`
    (0..1) of the filler, then the question. Sized in words at TOKENS_PER_WORD; the server's
    usage gives the true count. The nonce opens the prompt so that no two needle prompts share
    a prefix: a prefix-cache hit would make prefill look faster than it is."""
    intro = f"Journal {nonce}. {INTRO}"
    budget = round(tokens / TOKENS_PER_WORD) - len(f"{intro} {fact} {QUESTION}".split())
    sentences: list[str] = []
    words = 0
    while words < budget:
        sentence = FILLER[len(sentences) % len(FILLER)]
        sentences.append(sentence)
        words += len(sentence.split())
    sentences.insert(round(position * len(sentences)), fact)
    body = " ".join(sentences)
    return [{"role": "user", "content": f"{intro}\n\n{body}\n\n{QUESTION}"}]
