"""Label, probability, confidence and usage validity (protocol, "Integrity, missingness...").

"A selected label is valid only for HTTP200, no error field, explicit
validated_success:true, the pinned response model, a Choice answer and a string among the
four declared keys. Invalid probability maps do not erase an otherwise valid selected
label. Complete vectors require exactly all four finite coordinates in [0,1]; totals
within 0.02 plus numerical tolerance of one are accepted as independent cent rounding.
Missing coordinates remain missing. Confidence and nonnegative integer usage have separate
validity checks. A selected label that differs from the printed argmax is flagged."
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from renaming_assets.settings import Settings


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def label_failure(response: object, keys: list[str], settings: Settings) -> str | None:
    """The first failed label condition (a failure category), or None for a valid label."""
    if not isinstance(response, dict):
        return "no_response"
    if response.get("http_status") != 200 or isinstance(response.get("http_status"), bool):
        return "http_status"
    if response.get("error") is not None:
        return "error"
    if response.get("validated_success") is not True:
        return "validated_success"
    if response.get("model") != settings.request.model:
        return "model"
    if response.get("answer_type") != settings.request.answer_type:
        return "answer_type"
    selected = response.get("selected")
    if not isinstance(selected, str) or selected not in keys:
        return "selected"
    return None


def probability_vector(response: object, keys: list[str], settings: Settings) -> tuple[float, ...] | None:
    """The complete vector in key order, or None (missing coordinates stay missing)."""
    probs = response.get("probabilities") if isinstance(response, dict) else None
    if not isinstance(probs, dict) or set(probs) != set(keys):
        return None
    values = [probs[k] for k in keys]
    if not all(_number(v) and 0 <= v <= 1 for v in values):
        return None
    inf = settings.inference
    if abs(sum(values) - 1) > inf.probability_total_tolerance + inf.numerical_tolerance:
        return None
    return tuple(float(v) for v in values)


def confidence_valid(response: object) -> bool:
    c = response.get("confidence") if isinstance(response, dict) else None
    return _number(c) and 0 <= c <= 1


def usage_valid(response: object) -> bool:
    u = response.get("usage") if isinstance(response, dict) else None
    return isinstance(u, dict) and bool(u) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in u.values())


def argmax_mismatch(selected: str, vector: tuple[float, ...], keys: list[str]) -> bool:
    """The selection is not among the printed maxima."""
    top = max(vector)
    return vector[keys.index(selected)] != top


@dataclass(frozen=True)
class Outcome:
    job: str
    label: str | None
    failure: str | None
    vector: tuple[float, ...] | None
    gold: str
    keys: tuple[str, ...]
    confidence_valid: bool
    usage_valid: bool
    argmax_flag: bool
    timed: bool


def outcome(job: str, row: dict, frozen: dict, settings: Settings) -> Outcome:
    keys = list(frozen["expected"]["keys"])
    response = row.get("response")
    failure = label_failure(response, keys, settings)
    label = response["selected"] if failure is None else None
    vector = probability_vector(response, keys, settings)
    timed = isinstance(row.get("started_at"), str) and _number(row.get("duration_s")) and row["duration_s"] >= 0
    return Outcome(job, label, failure, vector, frozen["expected"]["gold"], tuple(keys),
                   confidence_valid(response), usage_valid(response),
                   label is not None and vector is not None and argmax_mismatch(label, vector, keys), timed)
