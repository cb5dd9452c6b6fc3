"""A completion's text holds only what was generated, whatever its prompt's tokens decode to (a vLLM general plugin,
loaded in the Sampler's processes).

vLLM primes each request's decode stream (tokenizers' `DecodeStream`) with the prompt's token ids. When those end in an
incomplete character (prompts given as token ids: what evaluation tools send), the stream never moves past them, and
its first text is the whole prompt's followed by the first generated token's: `/v1/completions` answered the prompt's
text in front of the completion, `echo` unset. Here the first text a request's stream gives loses that prompt text.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("tinker_serve.sampler")

_INCOMPLETE = "\ufffd"  # what a decode shows for bytes that are not (yet) a whole character
_TAIL_TOKENS = 4  # enough to end on the last character's bytes


def install() -> None:
    """Wrap vLLM's fast incremental detokenizer (vLLM 0.32's `FastIncrementalDetokenizer`)."""
    from vllm.v1.engine import detokenizer

    cls = detokenizer.FastIncrementalDetokenizer
    if getattr(cls, "_tinker_serve_prompt_text", False):
        return
    original_init, original_step = cls.__init__, cls._protected_step

    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        original_init(self, tokenizer, request)
        self._unsent_prompt = unsent_prompt(
            self.tokenizer, list(request.prompt_token_ids or []), self.skip_special_tokens
        )

    def _protected_step(self: Any, next_token_id: int) -> str | None:
        return drop_prompt(self, original_step(self, next_token_id))

    cls.__init__ = __init__  # type: ignore[method-assign]
    cls._protected_step = _protected_step  # type: ignore[method-assign]
    cls._tinker_serve_prompt_text = True  # type: ignore[attr-defined]


def unsent_prompt(tokenizer: Any, prompt: list[int], skip_special_tokens: bool) -> str:
    """The prompt's text when its decode stream would hold it back (it ends in an incomplete character), else ""."""
    if not prompt or not tokenizer.decode(prompt[-_TAIL_TOKENS:], skip_special_tokens=skip_special_tokens).endswith(
        _INCOMPLETE
    ):
        return ""
    return str(tokenizer.decode(prompt, skip_special_tokens=skip_special_tokens))


def drop_prompt(stream: Any, text: str | None) -> str | None:
    """`text`, the stream's next, without the held-back prompt text it starts with (once: the first text only). A
    generated token that completes the prompt's last character makes that character new text."""
    prompt = stream._unsent_prompt
    if not text or not prompt:
        return text
    stream._unsent_prompt = ""
    for held in (prompt, prompt.rstrip(_INCOMPLETE)):
        if text.startswith(held):
            return text[len(held) :]
    return text
