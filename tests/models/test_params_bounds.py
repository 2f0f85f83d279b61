"""Generate inputs with no bound of H3's own get Drainboard's: the prompt in tokens, the canvas in pixels."""

from __future__ import annotations

import time

from models.request.params import (MAX_CANVAS_EDGE, MAX_PROMPT_BYTES, MAX_PROMPT_TOKENS, GenerateParams, GenerateParamsError,
                           ModelSpec, validate_params)
from models.checkpoint.text_aux import load_tokenizer


def _problems(h3_tiny, **params) -> dict[str, str]:
    try:
        validate_params(GenerateParams(**{"prompt": "a fox", "frames": 124, **params}), ModelSpec.read(h3_tiny))
    except GenerateParamsError as e:
        return e.problems
    return {}


def test_a_huge_prompt_is_refused_at_once_with_the_bound(h3_tiny):
    started = time.monotonic()
    problem = _problems(h3_tiny, prompt="a red fox " * 10_000)["prompt"]
    assert problem == f"is 100,000 bytes, far over the bound (a prompt is at most {MAX_PROMPT_TOKENS:,} tokens, " \
                      f"and at most {MAX_PROMPT_BYTES:,} bytes)"
    assert time.monotonic() - started < 5


def test_a_prompt_between_the_byte_bounds_is_counted_with_the_checkpoints_tokenizer(h3_tiny):
    tokenizer = load_tokenizer(h3_tiny / "tokenizer")
    prompt = "a red fox runs " * 400  # 6,000 bytes
    tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert MAX_PROMPT_TOKENS < tokens  # the tiny tokenizer has few merges
    assert _problems(h3_tiny, prompt=prompt)["prompt"] == f"is {tokens:,} tokens; a prompt is at most 2,048 tokens"
    assert "prompt" not in _problems(h3_tiny, prompt="a red fox runs " * 100)  # 1,500 bytes: never over


def test_the_canvas_is_bounded(h3_tiny):
    problems = _problems(h3_tiny, height=3_200_000, width=3_200_000)
    assert problems["height"] == f"3,200,000 px is more than the largest canvas edge, {MAX_CANVAS_EDGE:,} px"
    assert "width" in problems
    assert not {"height", "width"} & set(_problems(h3_tiny, height=64, width=128))
