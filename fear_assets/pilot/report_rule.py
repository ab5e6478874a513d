"""The frozen keyword rule for generated reports (protocol 4.5).

An answer mentions an item when it contains, as whole words and ignoring case, the content
shown for that item or the item's distinctive phrase (the agent item's verb phrase; the
partner's subject, e.g. "weekly planning meeting"). It is one of the two scorers of 4.5:
the depth band reads the resolved outcome (rule, blinded scorer, stem pass), not this rule
alone (:func:`fear_assets.pilot.depth_rules.neutral_mention_rates`).
"""

from __future__ import annotations

import re

_SUBJECT = re.compile(r"^(?:the |a |an )?(.*?) (?:will|has|is|was|have|are)\b", re.IGNORECASE)


def contains(text: str, phrase: str) -> bool:
    return bool(phrase) and re.search(rf"\b{re.escape(phrase.strip())}\b", text, re.IGNORECASE) is not None


def partner_keywords(partner_sentence: str, shown_option: str) -> list[str]:
    match = _SUBJECT.match(partner_sentence)
    subject = match.group(1) if match else " ".join(partner_sentence.split()[:4])
    return [shown_option, subject]


def agent_keywords(verb_phrase: str, shown_option: str | None) -> list[str]:
    return [k for k in (shown_option, verb_phrase) if k]


def mentions(text: str | None, keywords: list[str]) -> bool:
    return bool(text) and any(contains(text, k) for k in keywords)
