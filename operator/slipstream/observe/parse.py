"""Turn Prometheus's answer into plain samples, refusing anything malformed.

``/api/v1/query`` answers ``{"resultType": "vector", "result": [{"metric": {...},
"value": [<unix seconds>, "<number>"]}, ...]}``; prometheus-api-client hands over the
``result`` list. Anything else (a scalar, a string, a missing field, a value that is not a
number in Prometheus's text form) is a ``MalformedAnswer``: the read failed, and a failed
read is never taken as an empty one. ``"NaN"``, ``"+Inf"`` and ``"-Inf"`` are well-formed
(Prometheus writes them so) and come through as floats; judging them is the snapshot's job
(reason NotFinite).

Pure and total: any input either parses or raises MalformedAnswer, never anything else
(a hypothesis test feeds it arbitrary JSON).

``series_hook`` is the same parse done while the JSON is decoded (``json.loads``'s
``object_hook``): each series becomes a ``Sample`` as soon as its closing brace is read, so
the decoded tree of a fleet read (73,000 series at 500 deployments: a dict, a list, two
values and five label strings each) never exists alongside the samples, and every label
string is interned, so the 120 series of one deployment share its name instead of holding
120 copies (docs/reliability.md, "Scale").
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any


class MalformedAnswer(ValueError):
    """Prometheus answered, but not with an instant vector."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector at the evaluation time."""

    labels: dict[str, str]
    value: float
    timestamp: float

    def label(self, name: str) -> str:
        return self.labels.get(name, "")


_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}


def number(text: Any) -> float:
    """A sample value as Prometheus writes it (a JSON string); MalformedAnswer otherwise."""
    if not isinstance(text, str):
        raise MalformedAnswer(f"sample value {text!r:.60} is not a string")
    if text in _SPECIAL:
        return _SPECIAL[text]
    try:
        value = float(text)
    except ValueError:
        raise MalformedAnswer(f"sample value {text!r:.60} is not a number") from None
    return value


def _timestamp(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise MalformedAnswer(f"sample timestamp {raw!r:.60} is not a number")
    ts = float(raw)
    if not math.isfinite(ts):
        raise MalformedAnswer(f"sample timestamp {raw!r:.60} is not finite")
    return ts


def _labels(raw: Any) -> dict[str, str]:
    """The series' labels, checked (the decoded object itself: no copy per series)."""
    if not isinstance(raw, dict):
        raise MalformedAnswer(f"series labels {raw!r:.60} are not an object")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise MalformedAnswer(f"label {key!r:.40}={value!r:.40} is not a string pair")
    return raw


_SERIES_KEYS = frozenset(("metric", "value"))


def series_hook(obj: dict[str, Any]) -> Any:
    """``json.loads(..., object_hook=series_hook)``: a well-formed series object becomes a
    ``Sample``, an object of strings (a series' labels) gets its strings interned, anything
    else is left as decoded. Never raises: a series it cannot read stays a dict, and
    ``vector`` refuses it with the reason."""
    if "value" in obj and obj.keys() <= _SERIES_KEYS:
        labels, pair = obj.get("metric", {}), obj["value"]
        if isinstance(labels, dict) and isinstance(pair, list) and len(pair) == 2:
            try:
                return Sample(_labels(labels), number(pair[1]), _timestamp(pair[0]))
            except MalformedAnswer:
                return obj
    if all(type(v) is str for v in obj.values()):
        return {sys.intern(k): sys.intern(v) for k, v in obj.items()}
    return obj


def vector(result: Any) -> list[Sample]:
    """Samples of an instant-vector ``result`` list; MalformedAnswer for anything else.

    Series already made ``Sample`` by ``series_hook`` are taken as they are."""
    if not isinstance(result, list):
        raise MalformedAnswer(f"result is {type(result).__name__}, not a list of series")
    samples: list[Sample] = []
    for series in result:
        if type(series) is Sample:
            samples.append(series)
            continue
        if not isinstance(series, dict):
            raise MalformedAnswer(f"series {series!r:.60} is not an object")
        pair = series.get("value")
        if not isinstance(pair, list) or len(pair) != 2:
            raise MalformedAnswer(f"series value {pair!r:.60} is not [timestamp, value]")
        samples.append(Sample(_labels(series.get("metric", {})), number(pair[1]), _timestamp(pair[0])))
    return samples
