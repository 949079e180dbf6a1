"""Request bodies of the serving endpoints -> what the twin needs to know (pure).

The simulator has no tokenizer: a prompt's size is its number of whitespace-separated words
(text) or token ids (a list of ints). An optional ``"slipstream"`` object states sizes
exactly, as the load generator sends a trace's requests:

- ``prompt_tokens`` N: the prompt's size (instead of counting);
- ``blocks`` and ``block_sizes``: prefix block ids and their sizes (a trace's hash ids;
  equal ids are shared prefix blocks; sizes add up to N), with optional ``warm_blocks`` W
  (0..len(blocks), default 0): the first W blocks are placed in the prefix cache when the
  request arrives, as the twin does for ``Request.warm_blocks`` (an earlier turn, a shared
  document computed just before);
- ``prefix_id`` P with ``cached_tokens`` M: the first M tokens are a prefix shared by every
  request naming P (a hit when the twin's cache still holds it), the rest is unique;
- ``cached_tokens`` M alone: M leading tokens are already in the cache on arrival.

Without those, the prompt's text or ids are hashed in blocks of ``TEXT_BLOCK_TOKENS``, so
identical prompt prefixes hit the twin's prefix cache as they would SGLang's radix cache.
Every refusal is a ``BodyError`` naming the field and the fix (HTTP 400).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

TEXT_BLOCK_TOKENS = 256
"""Granularity of prefix matching for plain prompts (tokens per hashed block)."""
MAX_TOKENS_LIMIT = 1_000_000
"""Largest prompt or output size accepted (tokens)."""
DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for completions; also used for chat."""
DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default ``sampling_params.max_new_tokens`` for /generate."""

_TEXT_SPACE = 3 << 61
_PREFIX_SPACE = 2 << 61
_UNIQUE_SPACE = 1 << 61
"""Block-id spaces (above any trace's hash ids) so the three kinds never collide."""
_unique = itertools.count()


class BodyError(ValueError):
    """A request body the simulator refuses (HTTP 400); the message names the field."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """One request as the twin sees it."""

    prompt_tokens: int
    output_tokens: int
    stream: bool
    blocks: tuple[int, ...]
    block_sizes: tuple[int, ...]
    warm_blocks: int = 0
    include_usage: bool = False
    model: str | None = None


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or BodyError."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(obj, dict):
        raise BodyError(f"body must be a JSON object, got {type(obj).__name__}")
    return obj


def completion(body: dict[str, Any]) -> Incoming:
    """``/v1/completions``: ``prompt`` (text or token ids), ``max_tokens``, ``stream``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and not all(_is_int(t) for t in prompt):
        raise BodyError("prompt: batched prompts are not supported by the simulator; "
                        "send one prompt (text or a list of token ids) per request")
    units = _units(prompt, "prompt")
    return _incoming(body, units, _max_tokens(body, ("max_tokens",), DEFAULT_MAX_TOKENS))


def chat(body: dict[str, Any]) -> Incoming:
    """``/v1/chat/completions``: the words of every message's content."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BodyError("messages: must be a non-empty list of {role, content} objects")
    units: list[str] = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BodyError(f"messages[{k}]: must be an object with a string 'role'")
        content = msg.get("content")
        if content is None:
            continue
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in parts):
                raise BodyError(f"messages[{k}].content: parts must be {{type: text, text: ...}}")
            content = " ".join(t for t in parts if isinstance(t, str))
        if not isinstance(content, str):
            raise BodyError(f"messages[{k}].content: must be a string or a list of text parts")
        units += [msg["role"], *content.split()]
    max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"), DEFAULT_MAX_TOKENS)
    return _incoming(body, units, max_tokens)


def generate(body: dict[str, Any]) -> Incoming:
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params.max_new_tokens``."""
    if "text" in body and body["text"] is not None:
        units = _units(body["text"], "text")
    else:
        units = _units(body.get("input_ids"), "input_ids")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BodyError("sampling_params: must be an object")
    return _incoming(body, units, _max_tokens(params, ("max_new_tokens",), DEFAULT_MAX_NEW_TOKENS,
                                              where="sampling_params."))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _units(prompt: object, field: str) -> list[Any]:
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return prompt
    raise BodyError(f"{field}: must be a string or a list of token ids")


def _max_tokens(body: dict[str, Any], names: tuple[str, ...], default: int, where: str = "") -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or not 0 <= value <= MAX_TOKENS_LIMIT:
            raise BodyError(f"{where}{name}: must be an integer in 0..{MAX_TOKENS_LIMIT}, got {value!r}")
        return max(1, int(value))
    return default


def _incoming(body: dict[str, Any], units: list[Any], output_tokens: int) -> Incoming:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BodyError(f"stream: must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    model = body.get("model")
    extra = body.get("slipstream")
    if extra is not None:
        if not isinstance(extra, dict):
            raise BodyError("slipstream: must be an object such as "
                            '{"prompt_tokens": 4096, "prefix_id": "doc-1", "cached_tokens": 2048}')
        blocks, sizes, warm, n = _stated(extra, len(units))
    else:
        n = len(units)
        if n == 0:
            raise BodyError("prompt: is empty; send at least one token")
        blocks, sizes, warm = _text_blocks(units), _chunk_sizes(n), 0
    if n > MAX_TOKENS_LIMIT:
        raise BodyError(f"prompt: {n} tokens is more than the simulator's {MAX_TOKENS_LIMIT}")
    return Incoming(n, output_tokens, stream, blocks, sizes, warm, include_usage,
                    model if isinstance(model, str) else None)


def _stated(extra: dict[str, Any], counted: int) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    known = {"prompt_tokens", "prefix_id", "cached_tokens", "blocks", "block_sizes", "warm_blocks"}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise BodyError(f"slipstream: unknown field(s) {unknown}; known: {sorted(known)}")
    n = extra.get("prompt_tokens", counted)
    if not _is_int(n) or not 1 <= n <= MAX_TOKENS_LIMIT:
        raise BodyError(f"slipstream.prompt_tokens: must be an integer in 1..{MAX_TOKENS_LIMIT}, got {n!r}")
    if "blocks" in extra or "block_sizes" in extra:
        blocks, sizes = extra.get("blocks"), extra.get("block_sizes")
        if (not isinstance(blocks, list) or not isinstance(sizes, list) or len(blocks) != len(sizes)
                or not blocks or not all(_is_int(b) and b >= 0 for b in blocks)
                or not all(_is_int(s) and s > 0 for s in sizes)):
            raise BodyError("slipstream.blocks/block_sizes: must be equally long non-empty lists "
                            "of block ids >= 0 and sizes > 0")
        if sum(sizes) != n:
            raise BodyError(f"slipstream.block_sizes: add up to {sum(sizes)}, but prompt_tokens is {n}")
        warm = extra.get("warm_blocks", 0)
        if not _is_int(warm) or not 0 <= warm <= len(blocks):
            raise BodyError(f"slipstream.warm_blocks: must be an integer in 0..len(blocks) "
                            f"({len(blocks)}), got {warm!r}")
        return tuple(blocks), tuple(sizes), int(warm), n
    if "warm_blocks" in extra:
        raise BodyError("slipstream.warm_blocks: counts leading blocks of slipstream.blocks; give "
                        "blocks and block_sizes with it (or cached_tokens alone for a warm prefix)")
    cached = extra.get("cached_tokens", 0)
    if not _is_int(cached) or not 0 <= cached <= n:
        raise BodyError(f"slipstream.cached_tokens: must be an integer in 0..prompt_tokens ({n}), "
                        f"got {cached!r}")
    prefix = extra.get("prefix_id")
    if prefix is not None and not isinstance(prefix, str):
        raise BodyError(f"slipstream.prefix_id: must be a string, got {prefix!r}")
    rest = n - cached
    if not cached:
        return (_unique_id(),), (n,), 0, n
    head = _prefix_id(prefix) if prefix is not None else _unique_id()
    blocks = (head, _unique_id()) if rest else (head,)
    sizes = (cached, rest) if rest else (cached,)
    return blocks, sizes, (0 if prefix is not None else 1), n


def _unique_id() -> int:
    return _UNIQUE_SPACE + next(_unique)


def _prefix_id(prefix: str) -> int:
    digest = hashlib.blake2b(prefix.encode(), digest_size=7).digest()
    return _PREFIX_SPACE + int.from_bytes(digest, "big")


def _chunk_sizes(n: int) -> tuple[int, ...]:
    full, tail = divmod(n, TEXT_BLOCK_TOKENS)
    return (TEXT_BLOCK_TOKENS,) * full + ((tail,) if tail else ())


def _text_blocks(units: list[Any]) -> tuple[int, ...]:
    """Chained hashes of the prompt's blocks: equal ids only for equal prefixes."""
    out: list[int] = []
    h = hashlib.blake2b(digest_size=7)
    for start in range(0, len(units), TEXT_BLOCK_TOKENS):
        h.update(" ".join(map(str, units[start:start + TEXT_BLOCK_TOKENS])).encode() + b"\x00")
        out.append(_TEXT_SPACE + int.from_bytes(h.copy().digest(), "big"))
    return tuple(out)


def check_length(inc: Incoming, context_length: int | None, kv_pool_tokens: int | None) -> None:
    """SGLang's input-length checks, with its messages: the context length (tokenizer) and
    the KV pool (scheduler: a prompt that cannot fit an idle engine is refused)."""
    if context_length is not None and inc.prompt_tokens >= context_length:
        raise BodyError(f"The input ({inc.prompt_tokens} tokens) is longer than the model's "
                        f"context length ({context_length} tokens).")
    if kv_pool_tokens is not None and inc.prompt_tokens >= kv_pool_tokens:
        raise BodyError(f"Input length ({inc.prompt_tokens} tokens) exceeds the maximum allowed "
                        f"length ({kv_pool_tokens} tokens). Use a shorter input or enable "
                        "--allow-auto-truncate.")


def tenant_labels(header: str | None, allowed: tuple[str, ...]) -> dict[str, str]:
    """Metric labels from the custom-labels header, as SGLang takes them: a JSON object,
    allowed keys only; anything else is ignored (the request is still served)."""
    labels = dict.fromkeys(allowed, "")
    if not header or not allowed:
        return labels
    try:
        raw = json.loads(header)
    except ValueError:
        return labels
    if isinstance(raw, dict):
        for key in allowed:
            if key in raw and raw[key] is not None:
                labels[key] = str(raw[key])
    return labels
