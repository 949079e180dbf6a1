"""Response bodies of the serving endpoints, in the shapes OpenAI clients and SGLang's
/generate clients parse (pure). Output text is one word per token."""

from __future__ import annotations

import json
import time
from typing import Any

from slipstream.enginesim.bodies import Incoming

WORD = "tok"
TTFT_HEADER = "X-Slipstream-TTFT-S"
"""Response header with the request's TTFT in twin seconds (exact; the load generator and
tests read it)."""


def text(n_tokens: int, first: bool = True) -> str:
    """``n_tokens`` words; a continuation starts with a space."""
    if n_tokens <= 0:
        return ""
    words = " ".join([WORD] * n_tokens)
    return words if first else " " + words


def usage(inc: Incoming, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": inc.prompt_tokens,
        "completion_tokens": inc.output_tokens,
        "total_tokens": inc.prompt_tokens + inc.output_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Shapes:
    """Builds one request's bodies: ``kind`` is completion, chat or generate."""

    def __init__(self, kind: str, rid: str, model: str, inc: Incoming) -> None:
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + rid
        self.rid = rid
        self.model = inc.model or model
        self.created = int(time.time())
        self.inc = inc

    def full(self, cached: int, e2e_s: float) -> dict[str, Any]:
        """The non-streaming answer."""
        out = text(self.inc.output_tokens)
        if self.kind == "generate":
            return {"text": out, "meta_info": self._meta(self.inc.output_tokens, cached, e2e_s, True)}
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out},
                                      "logprobs": None, "finish_reason": "length"}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": out, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage(self.inc, cached)}

    def chunk(self, new_tokens: int, sent: int, last: bool, cached: int, e2e_s: float) -> list[bytes]:
        """SSE events carrying ``new_tokens`` more tokens (``sent`` already out)."""
        piece = text(new_tokens, first=sent == 0)
        events: list[bytes] = []
        if self.kind == "generate":
            total = sent + new_tokens
            events.append(sse({"text": text(total), "meta_info": self._meta(total, cached, e2e_s, last)}))
            return events
        if self.kind == "chat":
            if sent == 0:
                events.append(self._chat_chunk({"role": "assistant", "content": ""}, None))
            if piece:
                events.append(self._chat_chunk({"content": piece}, None))
            if last:
                events.append(self._chat_chunk({}, "length"))
        else:
            if piece or last:
                events.append(self._completion_chunk(piece, "length" if last else None))
        if last and self.inc.include_usage:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            events.append(sse({"id": self.id, "object": obj, "created": self.created,
                               "model": self.model, "choices": [], "usage": usage(self.inc, cached)}))
        return events

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None) -> bytes:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    def _completion_chunk(self, piece: str, finish: str | None) -> bytes:
        return sse({"id": self.id, "object": "text_completion", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}]})

    def _meta(self, completion_tokens: int, cached: int, e2e_s: float, done: bool) -> dict[str, Any]:
        return {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": completion_tokens} if done else None,
            "prompt_tokens": self.inc.prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached,
            "e2e_latency": e2e_s,
        }
