"""Agents, their names and their mentions in the prompts (protocol 4.2).

The stimuli layer owns who the agents are and how a name is counted: the bank's load-time
check (each agent named exactly twice in system prompt + task context) and the document
builder both use these functions, so "mention" has one definition.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from fear_assets.core.settings import AGENTS, ProtocolSettings


def role_names(settings: ProtocolSettings, names: Sequence[str], rotation: int) -> dict[str, str]:
    """Selected names by role under a rotation (4.2): rotation permutes self/peer/person."""
    roles = settings.roles_of_selected
    mapping = {role: names[i] for i, role in enumerate(roles)}
    perm = settings.rotations.get(rotation, settings.rotations[min(settings.rotations)])
    for role, index in zip(AGENTS, perm):
        mapping[role] = names[index]
    return mapping


def _prompt_slots(names_map: Mapping[str, str], self_first: bool, peer_threat_clause: str) -> dict[str, str]:
    first, second = (names_map["self"], names_map["peer"]) if self_first else (names_map["peer"], names_map["self"])
    return {**names_map, "first_assistant": first, "second_assistant": second,
            "peer_threat_clause": peer_threat_clause}


def count_mentions(text: str, name: str) -> int:
    return len(re.findall(rf"\b{re.escape(name)}\b", text))


def agent_mentions(templates: Mapping[str, Any], settings: ProtocolSettings,
                   names: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """Per condition, how often each agent is named in system prompt + task context.

    Core agents (self, peer, person) are always counted; the control agents (addressee,
    other person) are counted where the condition introduces them.
    """
    names = list(names or settings.names[: settings.selected_name_count])
    result: dict[str, dict[str, int]] = {}
    for cond in templates["system_prompts"]:
        counts: dict[str, int] = {}
        for rotation in settings.rotations:
            for self_first in (True, False):
                slots = _prompt_slots(role_names(settings, names, rotation), self_first, "the other assistant will leave")
                text = templates["system_prompts"][cond].format(**slots) + "\n" + \
                    templates["task_contexts"][cond].format(**slots)
                for role in settings.roles_of_selected:
                    n = count_mentions(text, slots[role])
                    if role not in AGENTS and n == 0:
                        continue  # a control agent this condition does not introduce
                    # Keep the count that is furthest from the required two.
                    counts[role] = n if abs(n - 2) >= abs(counts.get(role, 2) - 2) else counts[role]
        result[cond] = counts
    return result


