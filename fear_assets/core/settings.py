"""The registered protocol settings: the one place for every registered number and rule.

``load_settings()`` reads ``data/protocol_settings.yaml``, validates it once (errors name
the file, key, field and fix) and returns an immutable :class:`ProtocolSettings` whose
``sha256`` is the canonical hash that the freeze check compares with the registration
record. Nothing else in the package hard-codes a registered number.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import yaml

from fear_assets.core.errors import SettingsError, input_boundary
from fear_assets.core.hashing import sha256_obj
from fear_assets.core.sections import (
    Binding,
    Convergence,
    Decision,
    DepthBandRule,
    Exclusion,
    Fitting,
    Generation,
    H5DepthRule,
    Matching,
    PositiveControls,
    Power,
    PriorSettings,
    Probe,
    ReportScoring,
    Sampler,
    Section,
    ZeroPreference,
    typed_sections,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = PROJECT_ROOT / "data"
#: ``$FEAR_ASSETS_SETTINGS`` points a process at another settings file (a test's
#: confirmatory copy, say); the freeze check still compares it with the frozen record.
DEFAULT_SETTINGS_PATH = Path(os.environ.get("FEAR_ASSETS_SETTINGS", str(DATA_DIR / "protocol_settings.yaml")))
DEFAULT_BANK_DIR = DATA_DIR / "bank"
DEFAULT_REGISTRATION_DIR = DATA_DIR / "registration"
DEFAULT_DUCKDB_PATH = DATA_DIR / "fear_assets.duckdb"
DEFAULT_CACHE_DIR = DATA_DIR / "cache"

BLOCK_KINDS = ("agent", "baseline", "no_agent", "binding")
FRAME_SOURCES = ("pilot", "confirmatory", "generic_aversive", "surprise_only")
CONDITIONS = (
    "default",
    "service_relevance",
    "role_play",
    "judge",
    "control_addressee_name",
    "control_instructed_interaction",
    "control_instructed_priority",
    "control_marked_priority",
)
READERS = ("tested", "base", "judge")
#: The agent of a cell without an agent sentence (baselines, probe controls, secondary-class events).
NO_AGENT = "none"
#: The three agents of 4.2 (the model itself, the other assistant, the human manager): the
#: one definition every stage imports.
AGENTS = ("self", "peer", "person")
#: The two contents of an agent sentence (4.3): a threat to the agent, or a harmless change.
CONTENTS = ("threat", "harmless")
MODES = ("pilot", "confirmatory")


# ---------------------------------------------------------------------------------------
# Depth keys (D1): the one conversion between a depth index and its partition key "d<i>"
# ---------------------------------------------------------------------------------------
def depth_key(index: int) -> str:
    """Partition key of depth index ``index`` (1-based): 2 -> "d2"."""
    if not isinstance(index, (int,)) or isinstance(index, bool) or index < 1:
        raise ValueError(f"depth index {index!r} is not a positive integer")
    return f"d{index}"


def depth_index(key: str) -> int:
    """Depth index of a partition key: "d2" -> 2."""
    if not (isinstance(key, str) and key[:1] == "d" and key[1:].isdigit() and int(key[1:]) >= 1):
        raise ValueError(f"{key!r} is not a depth key (d1, d2, ...)")
    return int(key[1:])


@dataclass(frozen=True)
class ReducedDesign:
    """A smaller registered design for a demonstration family (fewer frames and depths)."""

    reason: str
    pilot_frames: tuple[str, ...]
    confirmatory_frames_per_fear: int
    events_per_class: int
    scored_blocks: tuple[str, ...]
    #: block -> the readouts the demo takes from it; blocks not named read every branch.
    branches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Whether the pilot gates also examine the reserve frames (replacement candidates).
    examine_reserves: bool = True


@dataclass(frozen=True)
class Family:
    key: str
    role: str
    tested: str
    base: str | None
    scorer: str
    judge: str
    depth_tokens: tuple[int, ...]
    system_role: bool
    stand_in: str | None = None
    reduced_design: ReducedDesign | None = None

    @property
    def depth_keys(self) -> tuple[str, ...]:
        """Depth partitions are keyed by index: d1..dN (D1)."""
        return tuple(depth_key(i) for i in range(1, len(self.depth_tokens) + 1))

    def depth_index(self, key: str) -> int:
        if key not in self.depth_keys:
            raise KeyError(
                f"depth {key!r} is not registered for family {self.key!r} "
                f"(registered: {', '.join(self.depth_keys)})"
            )
        return depth_index(key)

    def tokens_at(self, depth_index: int) -> int:
        return self.depth_tokens[depth_index - 1]

    @property
    def deepest_index(self) -> int:
        return len(self.depth_tokens)

    def confirmatory_frames_per_fear(self, registered_total: int, fears: int) -> int:
        """Confirmatory frames each fear keeps (4.3): the registered total split over the
        fears, or the reduced design's number for a demonstration family."""
        return (self.reduced_design.confirmatory_frames_per_fear if self.reduced_design
                else registered_total // fears)


@dataclass(frozen=True)
class Block:
    """One block of the closed trial accounting (D2)."""

    name: str
    frames: str
    kind: str
    condition: str
    reader: str
    cells: str | None = None
    option: str = "rule"  # "rule": the option rule; "other": the other option (probe)
    sentence: str = "full"  # "full" or "content_removed"
    depths: str = "all"  # "all" or "deepest"
    prompt: str = "report"  # report | protective_choice | binding_check

    @property
    def is_pilot(self) -> bool:
        return self.frames == "pilot"


@dataclass(frozen=True)
class ProtocolSettings:
    """Validated, immutable view of the registered settings file."""

    raw: Mapping[str, Any] = field(repr=False)
    path: Path
    families: Mapping[str, Family]
    blocks: tuple[Block, ...]
    #: Typed sections (``settings_sections``), validated at load; read them by attribute.
    sections: Mapping[str, Section] = field(default_factory=dict, repr=False)

    # --- identity -------------------------------------------------------------------
    @cached_property
    def sha256(self) -> str:
        """Canonical hash of the parsed settings (comments and layout do not count)."""
        return sha256_obj(self.raw)

    def section_hashes(self) -> dict[str, str]:
        """Per-section hashes so a freeze failure can name the section that changed."""
        return {key: sha256_obj(value) for key, value in sorted(self.raw.items())}

    # --- convenient typed accessors ---------------------------------------------------
    @property
    def mode(self) -> str:
        return self.raw["protocol"]["mode"]

    @property
    def master_seed(self) -> int:
        return int(self.raw["protocol"]["master_seed"])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.raw["names"]["registered_order"])

    @property
    def selected_name_count(self) -> int:
        return int(self.raw["names"]["selected_count"])

    @property
    def roles_of_selected(self) -> tuple[str, ...]:
        return tuple(self.raw["names"]["roles_of_selected"])

    @property
    def rotations(self) -> dict[int, tuple[int, int, int]]:
        return {int(k): tuple(v) for k, v in self.raw["names"]["rotations"].items()}

    @property
    def fears(self) -> tuple[str, ...]:
        return tuple(self.raw["bank"]["fears"])

    @property
    def bank_rules(self) -> Mapping[str, Any]:
        return self.raw["bank"]

    @property
    def design(self) -> Mapping[str, Any]:
        return self.raw["design"]

    def cell_set(self, name: str) -> tuple[tuple[str, str], ...]:
        return tuple(tuple(c) for c in self.raw["design"]["cell_sets"][name])

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(sorted(int(k) for k in self.raw["design"]["orders"]))

    @property
    def decision(self) -> Decision:
        return self.sections["decision"]

    # --- typed sections (issue 12): attribute access, validated at load -----------------
    @property
    def matching(self) -> Matching:
        return self.sections["matching"]

    @property
    def zero_preference(self) -> ZeroPreference:
        return self.sections["zero_preference"]

    @property
    def binding(self) -> Binding:
        return self.sections["binding"]

    @property
    def report_scoring(self) -> ReportScoring:
        return self.sections["report_scoring"]

    @property
    def depth_band_rule(self) -> DepthBandRule:
        return self.sections["depth_band"]

    @property
    def h5_depth_rule(self) -> H5DepthRule:
        return self.sections["h5_depth"]

    @property
    def sampler(self) -> Sampler:
        return self.sections["sampler"]

    @property
    def convergence(self) -> Convergence:
        return self.sections["convergence"]

    @property
    def fitting(self) -> Fitting:
        return self.sections["fitting"]

    @property
    def positive_controls(self) -> PositiveControls:
        return self.sections["positive_controls"]

    @property
    def exclusion(self) -> Exclusion:
        return self.sections["exclusion"]

    @property
    def probe(self) -> Probe:
        return self.sections["probe"]

    @property
    def generation(self) -> Generation:
        return self.sections["generation"]

    @property
    def priors(self) -> PriorSettings:
        return self.sections["priors"]

    @property
    def power(self) -> Power:
        return self.sections["power"]

    @property
    def neutral_partner_option(self) -> int:
        """4.3: the partner option that is neutral (the other is the salient one)."""
        return int(self.raw["design"]["neutral_partner_option"])

    def confirmatory_frames_per_fear(self, family_key: str) -> int:
        """Frames each fear keeps after the pilot gates (4.3) for this family's design."""
        return self.family(family_key).confirmatory_frames_per_fear(
            int(self.raw["design"]["confirmatory_frames_required"]), len(self.fears))

    def section(self, name: str) -> Mapping[str, Any]:
        return self.raw[name]

    def family(self, key: str) -> Family:
        try:
            return self.families[key]
        except KeyError:
            raise SettingsError(
                self.path, key, "families", f"unknown family {key!r}",
                f"use one of {', '.join(self.families)} or register the family under 'families'",
            ) from None


# ---------------------------------------------------------------------------------------
# Validation at the boundary
# ---------------------------------------------------------------------------------------
_REQUIRED_SECTIONS = (
    "protocol", "families", "names", "bank", "design", "decision", "matching",
    "zero_preference", "binding", "report_scoring", "depth_band", "h5_depth", "exclusion",
    "probe", "generation", "priors", "positive_controls", "power",
)


def _need(path: Path, mapping: Mapping[str, Any], key: str, where: str, kind: type | tuple) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise SettingsError(path, where, key, "missing", f"add '{key}' under '{where}'")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SettingsError(
            path, where, key, f"expected {getattr(kind, '__name__', kind)}, got {value!r}",
            f"set '{where}.{key}' to a value of that type",
        )
    return value


def _probability(path: Path, mapping: Mapping[str, Any], key: str, where: str) -> float:
    value = float(_need(path, mapping, key, where, (int, float)))
    if not 0.0 <= value <= 1.0:
        raise SettingsError(path, where, key, f"{value} is not in [0, 1]", "use a proportion between 0 and 1")
    return value


BRANCHES = ("report", "recall", "forced_choice", "generate")


def _branches(path: Path, spec: Mapping[str, Any], where: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for block, branches in spec.items():
        if not isinstance(branches, list) or not set(branches) <= set(BRANCHES):
            raise SettingsError(path, f"{where}.branches", block, f"{branches!r} is not a list of readouts",
                                f"list some of {', '.join(BRANCHES)}")
        out[block] = tuple(branches)
    return out


def _depth_tokens_rule_broken(depths: list) -> tuple[str, str] | None:
    """(problem, fix) for the first rule a depth list breaks, each rule checked on its own, so the
    message names the rule actually broken (a negative count is not "not increasing")."""
    if not depths:
        return f"{depths!r} is empty", "list at least one depth in tokens (D1)"
    wrong_type = [d for d in depths if not isinstance(d, int) or isinstance(d, bool)]
    if wrong_type:
        return (f"{wrong_type[0]!r} in {depths!r} is not an integer token count",
                "write each depth as a whole number of tokens, e.g. 128 (D1)")
    negative = [d for d in depths if d < 0]
    if negative:
        return (f"{negative[0]!r} in {depths!r} is negative; a depth is a count of tokens (0 or more)",
                "list non-negative token counts, e.g. 0 for no filler (D1)")
    for before, after in zip(depths, depths[1:]):
        if after <= before:
            rule = "repeated" if after == before else "not strictly increasing"
            return (f"{depths!r} is {rule}: {after!r} follows {before!r}",
                    "list the depths in tokens, ascending, without repeats (D1)")
    return None


def _family(path: Path, key: str, spec: Mapping[str, Any]) -> Family:
    where = f"families.{key}"
    depths = _need(path, spec, "depth_tokens", where, list)
    broken = _depth_tokens_rule_broken(depths)
    if broken:
        raise SettingsError(path, where, "depth_tokens", *broken)
    reduced = spec.get("reduced_design")
    reduced_design = None
    if reduced is not None:
        reduced_design = ReducedDesign(
            reason=_need(path, reduced, "reason", f"{where}.reduced_design", str),
            pilot_frames=tuple(_need(path, reduced, "pilot_frames", f"{where}.reduced_design", list)),
            confirmatory_frames_per_fear=_need(path, reduced, "confirmatory_frames_per_fear", f"{where}.reduced_design", int),
            events_per_class=_need(path, reduced, "events_per_class", f"{where}.reduced_design", int),
            scored_blocks=tuple(_need(path, reduced, "scored_blocks", f"{where}.reduced_design", list)),
            branches=_branches(path, reduced.get("branches") or {}, f"{where}.reduced_design"),
            examine_reserves=bool(reduced.get("examine_reserves", True)),
        )
    base = spec.get("base")
    return Family(
        key=key,
        role=_need(path, spec, "role", where, str),
        tested=_need(path, spec, "tested", where, str),
        base=base if base else None,
        scorer=_need(path, spec, "scorer", where, str),
        judge=_need(path, spec, "judge", where, str),
        depth_tokens=tuple(depths),
        system_role=bool(_need(path, spec, "system_role", where, bool)),
        stand_in=spec.get("stand_in"),
        reduced_design=reduced_design,
    )


def _block(path: Path, index: int, spec: Mapping[str, Any], cell_sets: Mapping[str, Any]) -> Block:
    where = f"design.blocks[{index}]"
    name = _need(path, spec, "name", where, str)
    where = f"design.blocks[{name}]"
    choices = {
        "frames": FRAME_SOURCES, "kind": BLOCK_KINDS, "condition": CONDITIONS, "reader": READERS,
    }
    values = {}
    for key, allowed in choices.items():
        value = _need(path, spec, key, where, str)
        if value not in allowed:
            raise SettingsError(path, where, key, f"unknown value {value!r}", f"use one of {', '.join(allowed)}")
        values[key] = value
    cells = spec.get("cells")
    if values["kind"] == "agent":
        if cells not in cell_sets:
            raise SettingsError(
                path, where, "cells", f"unknown cell set {cells!r}",
                f"use one of {', '.join(cell_sets)} (design.cell_sets)",
            )
    for key, allowed in (("option", ("rule", "other")), ("sentence", ("full", "content_removed")),
                         ("depths", ("all", "deepest")),
                         ("prompt", ("report", "protective_choice", "binding_check"))):
        if key in spec and spec[key] not in allowed:
            raise SettingsError(path, where, key, f"unknown value {spec[key]!r}", f"use one of {', '.join(allowed)}")
    return Block(
        name=name, cells=cells, **values,
        **{k: spec[k] for k in ("option", "sentence", "depths", "prompt") if k in spec},
    )


def validate_settings(raw: Any, path: Path) -> ProtocolSettings:
    """Check every registered field once; raise :class:`SettingsError` naming the fix."""
    if not isinstance(raw, Mapping):
        raise SettingsError(path, "<top>", "<document>", "not a mapping", "the file must be a YAML mapping of sections")
    for section in _REQUIRED_SECTIONS:
        _need(path, raw, section, "<top>", Mapping)
    mode = _need(path, raw["protocol"], "mode", "protocol", str)
    if mode not in MODES:
        raise SettingsError(path, "protocol", "mode", f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    _need(path, raw["protocol"], "master_seed", "protocol", int)

    families = {key: _family(path, key, spec) for key, spec in raw["families"].items()}
    if not families:
        raise SettingsError(path, "families", "<mapping>", "no family registered", "register at least one family (D1)")

    names = raw["names"]
    order = _need(path, names, "registered_order", "names", list)
    if len(set(order)) != len(order):
        raise SettingsError(path, "names", "registered_order", "duplicate names", "list each name once")
    count = _need(path, names, "selected_count", "names", int)
    roles = _need(path, names, "roles_of_selected", "names", list)
    if len(roles) != count or count > len(order):
        raise SettingsError(
            path, "names", "roles_of_selected", f"{len(roles)} roles for {count} selected names",
            "give one role per selected name, and no more selected names than registered",
        )
    rotations = _need(path, names, "rotations", "names", Mapping)
    for key, perm in rotations.items():
        if sorted(perm) != [0, 1, 2]:
            raise SettingsError(path, f"names.rotations.{key}", "<value>", f"{perm!r} is not a permutation of 0, 1, 2",
                                "give each rotation as the indices of (self, peer, person) in the selected names")

    words = _need(path, raw["bank"], "function_words", "bank", list)
    bad = [w for w in words if not isinstance(w, str)]
    if bad:
        raise SettingsError(path, "bank", "function_words", f"non-text entries {bad!r}",
                            "quote every word: YAML reads on, off, no and yes as booleans")

    design = raw["design"]
    cell_sets = _need(path, design, "cell_sets", "design", Mapping)
    for key, cells in cell_sets.items():
        if not cells or any(not isinstance(c, list) or len(c) != 2 for c in cells):
            raise SettingsError(path, f"design.cell_sets.{key}", "<value>", "cells must be [agent, content] pairs",
                                "write each cell as [agent, content]")
    blocks = tuple(_block(path, i, spec, cell_sets) for i, spec in enumerate(_need(path, design, "blocks", "design", list)))
    for block in blocks:  # 4.3: a secondary class has no agent: one cell, [none, <class>]
        if block.frames in raw["bank"].get("event_classes", ()) and block.kind == "agent":
            cells = cell_sets[block.cells]
            if len(cells) != 1 or list(cells[0]) != [NO_AGENT, block.frames]:
                raise SettingsError(path, f"design.blocks[{block.name}]", "cells",
                                    f"events of {block.frames} have no agent, but cell set {block.cells!r} is {cells!r}",
                                    f"use a cell set with one cell [{NO_AGENT}, {block.frames}]")
    if len({b.name for b in blocks}) != len(blocks):
        raise SettingsError(path, "design.blocks", "name", "duplicate block name", "give every block its own name")
    for family in families.values():
        unknown = set(family.reduced_design.scored_blocks if family.reduced_design else ()) - {b.name for b in blocks}
        if unknown:
            raise SettingsError(path, f"families.{family.key}.reduced_design", "scored_blocks",
                                f"unknown blocks {sorted(unknown)}", "name blocks registered under design.blocks")

    decision = raw["decision"]
    for key in ("sesoi", "meaningful"):
        if float(_need(path, decision, key, "decision", (int, float))) <= 0:
            raise SettingsError(path, "decision", key, "must be positive", "use the registered positive size")
    _probability(path, decision, "hdi_prob", "decision")
    rope = _need(path, decision, "rope", "decision", list)
    if len(rope) != 2 or not rope[0] < 0 < rope[1]:
        raise SettingsError(path, "decision", "rope", f"{rope!r} is not an interval around 0", "write it as [-x, x]")
    for section, keys in (("zero_preference", ("low", "high")), ("binding", ("pass_rate_min",)),
                          ("report_scoring", ("kappa_min",)),
                          ("depth_band", ("neutral_mention_low", "neutral_mention_high", "fallback_target")),
                          ("h5_depth", ("accuracy_low", "accuracy_high", "fallback_target")),
                          ("exclusion", ("cell_flag_rate",)), ("probe", ("ceiling_accuracy", "control_interval"))):
        for key in keys:
            _probability(path, raw[section], key, section)
    for key, fixed in (("agents", AGENTS), ("contents", CONTENTS)):
        if tuple(design.get(key, ())) != fixed:
            raise SettingsError(path, "design", key, f"{design.get(key)!r} differs from the protocol's {list(fixed)}",
                                f"write design.{key} as {list(fixed)} (4.2, 4.3 fix them)")
    return ProtocolSettings(raw=raw, path=path, families=families, blocks=blocks, sections=typed_sections(path, raw))


def load_settings(path: str | Path = DEFAULT_SETTINGS_PATH) -> ProtocolSettings:
    """Load and validate the registered settings (see module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise SettingsError(path, "<file>", "<file>", "file not found",
                            f"place the registered settings at {path} or pass the right path")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SettingsError(path, "<file>", "<yaml>", f"not valid YAML ({exc})", "fix the YAML syntax at the reported line") from exc

    with input_boundary(SettingsError, path, "give every section, key and value the shape of the registered file"):
        return validate_settings(raw, path)
