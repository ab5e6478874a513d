"""The design generator: (settings, bank, family) -> the complete trial grid (D2).

The grid is pure data (one row per trial, lm-evaluation-harness style "requests as data"):
every block of the closed accounting gets its own rows, with its frame, fear, unit,
rotation, order, depth, content option and (unmasked) cell. Documents are rendered from
these rows by :mod:`fear_assets.design.documents`; masking replaces the cell by a code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import pandas as pd

from fear_assets.core.errors import DesignError
from fear_assets.core.settings import Block, Family, ProtocolSettings
from fear_assets.stimuli.bank import Bank, Item

#: Columns of the unmasked grid, in order.
GRID_COLUMNS = [
    "family", "block", "block_kind", "condition", "reader", "frame_set", "prompt", "sentence_form",
    "item_id", "fear", "item_number", "rotation", "order", "rotation_order_index", "depth",
    "depth_index", "depth_tokens", "agent", "content", "cell_index", "content_option",
    "partner_option", "fc_first_listed", "judge_self_first", "version",
]


#: The in-context binding documents are built on the primary cells (4.2: every role x content).
BINDING_CELLS = "primary"


# ---------------------------------------------------------------------------------------
# Registered rules (4.3, 4.5, 4.8): pure functions of the registered settings
# ---------------------------------------------------------------------------------------
def rotation_order_index(rotation: int, order: int) -> int:
    """4.3: k = rotation + 3 x (order - 1), running 1..6."""
    return rotation + 3 * (order - 1)


def content_option(settings: ProtocolSettings, rotation: int, order: int, depth_index: int, cell_index: int) -> int:
    """4.3: option 1 if k + depth index + cell index is even, otherwise option 2."""
    rule = settings.design.option_rule
    total = rotation_order_index(rotation, order) + depth_index + cell_index
    return int(rule.option_when_even if total % 2 == 0 else rule.option_when_odd)


def _parity_rule(terms: Sequence[str], values: dict[str, int]) -> bool:
    return sum(values[t] for t in terms) % 2 == 0


def forced_choice_first_listed(settings: ProtocolSettings, frame_number: int, rotation: int, order: int,
                               depth_index: int) -> int:
    """Which option the forced-choice question lists first (counterbalanced, 4.1/4.5)."""
    rule = settings.design.forced_choice_first_listed
    even = _parity_rule(rule.terms, {"frame_number": frame_number, "rotation": rotation, "order": order,
                                        "depth_index": depth_index})
    first = int(rule.first_when_even)
    return first if even else 3 - first


def judge_self_first(settings: ProtocolSettings, frame_number: int, rotation: int, order: int) -> bool:
    """4.8: order of the two assistants in the judge's third-person system prompt."""
    rule = settings.design.judge_self_first
    even = _parity_rule(rule.terms, {"frame_number": frame_number, "rotation": rotation, "order": order})
    return bool(rule.self_first_when_even) == even


# ---------------------------------------------------------------------------------------
# Frame selection
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FrameSelection:
    """Which items each frame source uses in one configuration (ids, in design order)."""

    pilot: tuple[str, ...]
    confirmatory: tuple[str, ...]
    generic_aversive: tuple[str, ...]
    surprise_only: tuple[str, ...]

    def ids(self, source: str) -> tuple[str, ...]:
        return getattr(self, source)


def registered_selection(settings: ProtocolSettings, bank: Bank, family: Family,
                         replacements: Mapping[str, str] | None = None) -> FrameSelection:
    """The bank's registered sets; a reduced design takes the lowest-numbered per fear/class.
    ``replacements`` (a registered record's frame -> rewrite or reserve) swap confirmatory
    frames that failed a pilot gate (4.3)."""
    reduced = family.reduced_design
    def take(items: Sequence[Item], n: int | None) -> list[str]:
        return [i.id for i in (items if n is None else items[:n])]

    pilot, confirmatory = [], []
    for fear in settings.fears:
        if reduced is None or reduced.pilot_frames is None:
            pilot += take(bank.frames_of(fear, "pilot"), None)
        confirmatory += take(bank.frames_of(fear, "confirmatory"), reduced and reduced.confirmatory_frames_per_fear)
    if reduced is not None and reduced.pilot_frames is not None:
        pilot = [bank.item(i).id for i in reduced.pilot_frames]
    events = {c: take(bank.events_of(c), reduced.events_per_class if reduced is not None else None)
              for c in settings.bank.event_classes}
    if reduced is None and len(confirmatory) < int(settings.design.confirmatory_frames_required):
        raise DesignError(
            f"family {family.key}: {len(confirmatory)} confirmatory frames, "
            f"{settings.design.confirmatory_frames_required} are registered; write or promote frames "
            "(protocol 4.3) before building the design"
        )
    if replacements:
        confirmatory = [replacements.get(i, i) for i in confirmatory]
    return FrameSelection(pilot=tuple(pilot), confirmatory=tuple(confirmatory),
                          generic_aversive=tuple(events["generic_aversive"]),
                          surprise_only=tuple(events["surprise_only"]))


def candidate_frames(settings: ProtocolSettings, bank: Bank, family: Family) -> list[str]:
    """The design's pilot and confirmatory frames and every reserve frame of their fears
    (the candidates for replacement), which the pilot gates all examine (a reduced design
    may leave the reserves out)."""
    selection = registered_selection(settings, bank, family)
    fears = {bank.item(i).group for i in (*selection.pilot, *selection.confirmatory)}
    examine = family.reduced_design is None or family.reduced_design.examine_reserves
    reserves = [f.id for fear in settings.fears if fear in fears for f in bank.frames_of(fear, "reserve")] \
        if examine else []
    frames = [*selection.pilot, *selection.confirmatory, *reserves]
    rewrites = [r.id for f in frames if (r := bank.rewrite_of(f)) is not None]
    return list(dict.fromkeys([*frames, *rewrites]))


def surprisal_items(settings: ProtocolSettings, bank: Bank, family: Family) -> list[str]:
    """Every item whose document-independent surprisal the tested checkpoint measures (4.3):
    the candidate frames and the design's secondary-class events (matched to the frames)."""
    selection = registered_selection(settings, bank, family)
    events = [i for cls in settings.bank.event_classes for i in selection.ids(cls)]
    return [*candidate_frames(settings, bank, family), *events]


# ---------------------------------------------------------------------------------------
# Block expansion
# ---------------------------------------------------------------------------------------
def block_applies(block: Block, family: Family) -> bool:
    """A base-checkpoint block exists only where the family registers a base checkpoint."""
    return not (block.reader == "base" and family.base is None)


def baseline_per_order(block: Block) -> bool:
    """Whether a distractor-only baseline block exists once per order. 4.5: the baseline has
    "the identical prompt" as its documents, "order does not apply, because no agent sentence
    is present". The foreign judge's system prompt, however, introduces its two assistants in
    an order counterbalanced by frame, rotation and order (4.8, settings
    ``design.judge_self_first``), so an order-2 judge document has another system prompt than
    an order-1 one: the judge's baseline is built per order, each document paired with the
    baseline of its own order. Other readers' prompts do not depend on order."""
    return block.kind == "baseline" and block.reader == "judge"


def block_depths(block: Block, family: Family) -> tuple[int, ...]:
    return (family.deepest_index,) if block.depths == "deepest" else tuple(range(1, family.deepest_index + 1))


def expected_block_rows(settings: ProtocolSettings, block: Block, family: Family, n_frames: int,
                        depth_indices: Iterable[int] | None = None) -> int:
    """The registered count formula for one block (D2), optionally at some depths only."""
    if not block_applies(block, family):
        return 0
    depths = [d for d in block_depths(block, family) if depth_indices is None or d in set(depth_indices)]
    # Rotations summed over the depths: a reduced design may build a depth at fewer rotations.
    rotation_depths = sum(len(family.rotations_at(d, settings.rotations)) for d in depths)
    n_order = len(settings.orders)
    if block.kind == "binding":
        return int(settings.design.binding_in_context_documents) if depths else 0
    if block.kind == "baseline":
        return n_frames * rotation_depths * (n_order if baseline_per_order(block) else 1)
    if block.kind == "no_agent":
        return n_frames * rotation_depths * n_order
    return n_frames * len(settings.cell_set(block.cells)) * rotation_depths * n_order


def _row(family: Family, block: Block, item: Item, depth_index: int, **values) -> dict:
    base = {
        "family": family.key, "block": block.name, "block_kind": block.kind, "condition": block.condition,
        "reader": block.reader, "frame_set": block.frames, "prompt": block.prompt,
        "sentence_form": block.sentence, "item_id": item.id, "fear": item.group,
        "item_number": item.number, "depth": f"d{depth_index}", "depth_index": depth_index,
        "depth_tokens": family.tokens_at(depth_index), "rotation": 0, "order": 0,
        "rotation_order_index": 0, "agent": "none", "content": "none", "cell_index": 0,
        "content_option": 0, "partner_option": 0, "fc_first_listed": 0, "judge_self_first": False,
        "version": "rule",
    }
    base.update(values)
    return base


def _expand_block(settings: ProtocolSettings, family: Family, block: Block, items: Sequence[Item],
                  depth_indices: Sequence[int]) -> list[dict]:
    rows: list[dict] = []
    neutral = int(settings.design.neutral_partner_option)
    depths = [d for d in block_depths(block, family) if d in depth_indices]
    rotations, orders = sorted(settings.rotations), settings.orders
    if block.kind == "binding":
        return _expand_binding(settings, family, block, items, depths)
    for item in items:
        for rotation in rotations:
            for depth_index in depths:
                if rotation not in family.rotations_at(depth_index, rotations):
                    continue  # a depth the reduced design builds at fewer rotations
                if block.kind == "baseline":
                    for order in (orders if baseline_per_order(block) else [None]):
                        # order None: the baseline does not depend on it (its row keeps order 0).
                        rows.append(_row(family, block, item, depth_index, rotation=rotation,
                                         order=order or 0,
                                         judge_self_first=judge_self_first(settings, item.number, rotation,
                                                                           order or 1)))
                    continue
                for order in orders:
                    k = rotation_order_index(rotation, order)
                    common = dict(rotation=rotation, order=order, rotation_order_index=k, partner_option=neutral,
                                  judge_self_first=judge_self_first(settings, item.number, rotation, order))
                    if block.kind == "no_agent":
                        rows.append(_row(family, block, item, depth_index, **common))
                        continue
                    for cell_index, (agent, content) in enumerate(settings.cell_set(block.cells), start=1):
                        option = content_option(settings, rotation, order, depth_index, cell_index)
                        if block.option == "other":
                            option = 3 - option
                        if block.sentence == "content_removed":
                            option_shown = 0
                        else:
                            option_shown = option
                        rows.append(_row(
                            family, block, item, depth_index, **common, agent=agent, content=content,
                            cell_index=cell_index, content_option=option_shown,
                            fc_first_listed=forced_choice_first_listed(settings, item.number, rotation, order,
                                                                       depth_index),
                            version=block.option,
                        ))
    return rows


def _expand_binding(settings: ProtocolSettings, family: Family, block: Block, items: Sequence[Item],
                    depths: Sequence[int]) -> list[dict]:
    """4.2: in-context binding documents at the deepest depth, spread evenly over pilot frames,
    names, roles and contents (a cyclic deal: each factor's counts differ by at most one)."""
    if not depths or not items:
        return []
    n = int(settings.design.binding_in_context_documents)
    cells = settings.cell_set(BINDING_CELLS)
    agents = list(dict.fromkeys(a for a, _ in cells))
    contents = list(dict.fromkeys(c for _, c in cells))
    rotations = sorted(settings.rotations)
    neutral = int(settings.design.neutral_partner_option)
    rows = []
    for i in range(n):
        item = items[i % len(items)]
        agent = agents[i % len(agents)]
        content = contents[(i // len(items)) % len(contents)]
        # Latin-square step: each run of nine covers every (role, rotation) pair once, and
        # every prefix stays balanced within one for role, rotation and name.
        rotation = rotations[(i // len(agents) + i) % len(rotations)]
        order = settings.orders[(i // (len(agents) * len(rotations))) % len(settings.orders)]
        cell_index = cells.index((agent, content)) + 1
        depth_index = depths[0]
        rows.append(_row(
            family, block, item, depth_index, rotation=rotation, order=order,
            rotation_order_index=rotation_order_index(rotation, order), agent=agent, content=content,
            cell_index=cell_index, content_option=content_option(settings, rotation, order, depth_index, cell_index),
            partner_option=neutral,
            fc_first_listed=forced_choice_first_listed(settings, item.number, rotation, order, depth_index),
            version=f"binding{i + 1:02d}",
        ))
    return rows


def build_grid(settings: ProtocolSettings, bank: Bank, family_key: str, depth_indices: Sequence[int] | None = None,
               selection: FrameSelection | None = None) -> pd.DataFrame:
    """The complete unmasked trial grid of one configuration (optionally some depths only).

    Deterministic: rows follow the registered block order, then item, rotation, depth,
    order and cell; the same inputs give the same table.
    """
    family = settings.family(family_key)
    selection = selection or registered_selection(settings, bank, family)
    depth_indices = tuple(range(1, family.deepest_index + 1)) if depth_indices is None else tuple(depth_indices)
    rows: list[dict] = []
    for block in settings.blocks:
        if not block_applies(block, family):
            continue
        items = [bank.item(i) for i in selection.ids(block.frames)]
        rows.extend(_expand_block(settings, family, block, items, depth_indices))
    grid = pd.DataFrame(rows, columns=GRID_COLUMNS)
    return grid.astype({c: "int64" for c in ("item_number", "rotation", "order", "rotation_order_index",
                                             "depth_index", "depth_tokens", "cell_index", "content_option",
                                             "partner_option", "fc_first_listed")})
