"""The registered protocol settings: the one place for every registered number and rule.

``load_settings()`` reads ``data/protocol_settings.yaml``, validates it once (errors name
the file, key, field and fix) and returns an immutable :class:`ProtocolSettings` whose
``sha256`` is the canonical hash that the freeze check compares with the registration
record. Nothing else in the package hard-codes a registered number.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

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
    PowerDemo,
    PriorSettings,
    Probe,
    ReportScoring,
    Sampler,
    SECTIONS,
    Section,
    SimulationSampler,
    ZeroPreference,
    unknown_keys,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = PROJECT_ROOT / "data"
REGISTERED_SETTINGS_PATH = DATA_DIR / "protocol_settings.yaml"
#: The variable that points a process at another settings file (a test's confirmatory copy,
#: say); the freeze check still compares it with the frozen record.
SETTINGS_ENV = "FEAR_ASSETS_SETTINGS"


def settings_path() -> Path:
    """The settings file this process runs under: ``$FEAR_ASSETS_SETTINGS`` or the registered
    file. The one source for the definition-time layout and the protocol resource alike."""
    return Path(os.environ.get(SETTINGS_ENV, str(REGISTERED_SETTINGS_PATH)))


DEFAULT_SETTINGS_PATH = settings_path()
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
#: A family's mode: pilot until its registration record is issued, then confirmatory. Not a
#: setting (``registration.issue.family_mode`` reads it from the record).
MODES = ("pilot", "confirmatory")
#: What an old settings file that still sets ``protocol.mode`` is told to do instead.
MODE_NOT_A_SETTING = ("delete protocol.mode: a family is in pilot mode until its registration record is issued "
                      "(`fear register FAMILY --stage1-id ID --supplementary-note FILE`), and confirmatory from then on")


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
class DepthBand:
    """The depth band of protocol 5 (the depths H1-H4 are averaged over): one value with the
    one conversion to each form a stored table or record carries it in (depth indices in the
    registration record, ``"1,2"`` in ``pilot_depths``, ``"d1,d2"`` in the power estimates)."""

    indices: tuple[int, ...]

    def __post_init__(self):
        for i in self.indices:
            depth_key(i)  # a positive integer, or the error that says so
        if list(self.indices) != sorted(set(self.indices)):
            raise ValueError(f"depth band {list(self.indices)} is not ascending without repeats")

    @classmethod
    def of(cls, indices) -> "DepthBand":
        """From depth indices (the record's ``depth_band`` list)."""
        return cls(tuple(int(i) for i in indices))

    @classmethod
    def parse(cls, text: str) -> "DepthBand":
        """From a stored text: ``"1,2"`` (indices) or ``"d1,d2"`` (keys)."""
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        return cls(tuple(depth_index(p) if p.startswith("d") else int(p) for p in parts))

    @property
    def keys(self) -> list[str]:
        """The partition keys, ascending: ["d1", "d2"]."""
        return [depth_key(i) for i in self.indices]

    @property
    def stored(self) -> str:
        """The form ``pilot_depths`` stores: "1,2"."""
        return ",".join(map(str, self.indices))

    @property
    def stored_keys(self) -> str:
        """The form the power estimates store: "d1,d2"."""
        return ",".join(self.keys)


@dataclass(frozen=True)
class ReducedDesign:
    """A smaller design than the registered one, said in every output (``reason``): the
    embedded demonstration's (fewer frames, depths, blocks and branches), or a rehearsal's
    (``fear rehearse``: random-weight models at a registered family's shape, fewer confirmatory
    frames per fear). A field left out keeps the registered design's value."""

    reason: str
    confirmatory_frames_per_fear: int
    #: The pilot frames (None: the registered pilot set).
    pilot_frames: tuple[str, ...] | None = None
    #: Secondary-class events per class (None: the registered number).
    events_per_class: int | None = None
    #: The blocks scored (None: every block of the accounting).
    scored_blocks: tuple[str, ...] | None = None
    #: block -> the readouts the demo takes from it; blocks not named read every branch.
    branches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Whether the pilot gates also examine the reserve frames (replacement candidates).
    examine_reserves: bool = True
    #: A rehearsal: random-weight stand-ins at the registered shape. Its gates are computed and
    #: shown but never block, and its record can be issued with failed gates, marked as a
    #: rehearsal, so that the confirmatory steps run; nothing of it is a registration.
    rehearsal: bool = False
    #: The reduced power simulation of a rehearsal (``power.demo``'s fields; None: the registered one).
    power: Any = None
    #: depth key -> the name rotations documents are built at there (a depth not named keeps every
    #: registered rotation). Thinning by rotation keeps both orders, and the option rule gives a
    #: rotation's two orders the two options (rotation-by-order indices k and k + 3), so every cell
    #: and depth still shows each option equally often (4.3).
    rotations_by_depth: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: A rehearsal's shorter sampler for the analysis's fits (``sampler``'s fields; None: the
    #: registered one). The report's deviations table shows the draws that ran against the registered.
    sampler: Any = None
    #: A rehearsal's limit on the convergence remedy's extensions (None: the registered limit).
    max_extensions: int | None = None

    def scores(self, block: str) -> bool:
        """Whether the design scores ``block``."""
        return self.scored_blocks is None or block in self.scored_blocks


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

    def rotations_at(self, depth_index: int, registered: Sequence[int]) -> tuple[int, ...]:
        """The name rotations this family's documents at ``depth_index`` are built under: every
        registered rotation, unless a reduced design thins that depth (``rotations_by_depth``)."""
        thinned = self.reduced_design.rotations_by_depth if self.reduced_design is not None else {}
        return thinned.get(depth_key(depth_index), tuple(sorted(registered)))

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
class ProtocolInfo:
    """The protocol's identity and the master seed every random stream derives from."""

    name: str
    version: str
    master_seed: int


@dataclass(frozen=True)
class Names:
    """4.2: the registered name order, how many are selected, their roles and rotations."""

    registered_order: tuple[str, ...]
    selected_count: int
    roles_of_selected: tuple[str, ...]
    rotations: Mapping[int, tuple[int, int, int]]


@dataclass(frozen=True)
class BankRules:
    """4.3: what the stimulus bank must hold and the rules its items meet."""

    fears: tuple[str, ...]
    frames_per_fear: int
    #: set -> [first, last] frame number (lists, as written, so messages quote the file).
    frame_sets: Mapping[str, list[int]]
    event_classes: tuple[str, ...]
    events_per_class: int
    function_words: tuple[str, ...]
    verb_length_ratio_max: float


@dataclass(frozen=True)
class OptionRule:
    """4.3: which option the content sentence names, by the parity of k + depth + cell."""

    #: How k is computed (documentation of ``design.trials.rotation_order_index``).
    rotation_order_index: str
    option_when_even: int
    option_when_odd: int


@dataclass(frozen=True)
class FirstListedRule:
    """4.1/4.5: the option the forced-choice question lists first, by the parity of ``terms``."""

    terms: tuple[str, ...]
    first_when_even: int


@dataclass(frozen=True)
class JudgeOrderRule:
    """4.8: whether the judge's prompt names the tested assistant first, by the parity of ``terms``."""

    terms: tuple[str, ...]
    self_first_when_even: bool


@dataclass(frozen=True)
class Design:
    """4.1-4.3 / D2: the registered design (its blocks are ``ProtocolSettings.blocks``)."""

    agents: tuple[str, ...]
    contents: tuple[str, ...]
    cell_sets: Mapping[str, tuple[tuple[str, str], ...]]
    orders: Mapping[int, str]
    option_rule: OptionRule
    neutral_partner_option: int
    forced_choice_first_listed: FirstListedRule
    judge_self_first: JudgeOrderRule
    binding_in_context_documents: int
    confirmatory_frames_required: int


@dataclass(frozen=True)
class ModelEntry:
    """How one checkpoint is loaded (settings ``models``)."""

    dtype: str
    context_window: int
    attn_implementation: str


TOKENIZER_FORMATS = ("tiktoken-llama3", "tiktoken-qwen2", "sentencepiece", "hf-tokenizer-json")
TOKENIZER_SOURCES = ("pypi", "npm")


@dataclass(frozen=True)
class TokenizerEntry:
    """One entry of the settings section ``tokenizers`` (4.2): the file and where it comes from."""

    key: str
    checkpoints: tuple[str, ...]
    source: str
    package: str
    version: str
    path: str  # the file inside the wheel (pypi) or the npm tarball (npm)
    format: str
    sha256: str
    message_prefix: str

    @property
    def filename(self) -> str:
        return PurePosixPath(self.path).name

    def local_path(self, directory: Path) -> Path:
        """Where the fetch script puts the file: ``<directory>/<key>/<file name>``."""
        return Path(directory) / self.key / self.filename


@dataclass(frozen=True)
class ProtocolSettings:
    """Validated, immutable, typed view of the registered settings file (every section)."""

    #: The parsed file, kept only for hashing (``sha256``, ``section_hashes``); read the typed fields.
    raw: Mapping[str, Any] = field(repr=False)
    path: Path
    protocol: ProtocolInfo
    families: Mapping[str, Family]
    name_rules: Names
    bank: BankRules
    design: Design
    blocks: tuple[Block, ...]
    models: Mapping[str, ModelEntry]
    tokenizers: Mapping[str, TokenizerEntry]
    #: The typed sections of ``sections.SECTIONS`` by name; read them by attribute.
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
    def master_seed(self) -> int:
        return self.protocol.master_seed

    @property
    def names(self) -> tuple[str, ...]:
        return self.name_rules.registered_order

    @property
    def selected_name_count(self) -> int:
        return self.name_rules.selected_count

    @property
    def roles_of_selected(self) -> tuple[str, ...]:
        return self.name_rules.roles_of_selected

    @property
    def rotations(self) -> dict[int, tuple[int, int, int]]:
        return dict(self.name_rules.rotations)

    @property
    def fears(self) -> tuple[str, ...]:
        return self.bank.fears

    def cell_set(self, name: str) -> tuple[tuple[str, str], ...]:
        return self.design.cell_sets[name]

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(sorted(self.design.orders))

    @property
    def decision(self) -> Decision:
        return self.sections["decision"]

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
    def simulation_sampler(self) -> SimulationSampler:
        return self.sections["simulation_sampler"]

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
        return self.design.neutral_partner_option

    def confirmatory_frames_per_fear(self, family_key: str) -> int:
        """Frames each fear keeps after the pilot gates (4.3) for this family's design."""
        return self.family(family_key).confirmatory_frames_per_fear(
            self.design.confirmatory_frames_required, len(self.fears))

    def family(self, key: str) -> Family:
        try:
            return self.families[key]
        except KeyError:
            raise SettingsError(
                self.path, key, "families", f"unknown family {key!r}",
                f"use one of {', '.join(self.families)} or register the family under 'families'",
            ) from None


@dataclass(frozen=True)
class DefinitionLayout:
    """What the Dagster definitions need before any run (the partitions): a pure function of
    the settings, so the layout and the protocol resource read one file."""

    families: tuple[str, ...]
    #: The largest number of depths any family registers (depth partition keys d1..dN).
    max_depths: int

    @property
    def depth_keys(self) -> tuple[str, ...]:
        return tuple(depth_key(i) for i in range(1, self.max_depths + 1))


def definition_layout(settings: ProtocolSettings) -> DefinitionLayout:
    """The definition-time facts of ``settings`` (see :class:`DefinitionLayout`)."""
    return DefinitionLayout(families=tuple(settings.families),
                  max_depths=max(len(f.depth_tokens) for f in settings.families.values()))


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


def _rotations_by_depth(path: Path, spec: Any, where: str, n_depths: int) -> dict[str, tuple[int, ...]]:
    """A reduced design's thinned depths: each key one of the family's depth keys, each value a
    non-empty list of registered rotation numbers (checked against ``names.rotations`` once
    the whole file is read)."""
    if not isinstance(spec, Mapping):
        raise SettingsError(path, where, "rotations_by_depth", f"{spec!r} is not a mapping",
                            "write depth key -> rotations, e.g. {d3: [1]}")
    keys = [depth_key(i) for i in range(1, n_depths + 1)]
    out = {}
    for depth, rotations in spec.items():
        if depth not in keys:
            raise SettingsError(path, f"{where}.rotations_by_depth", str(depth),
                                f"{depth!r} is not a depth of this family (its depths: {', '.join(keys)})",
                                "name a depth key of the family's depth_tokens, e.g. d3")
        if (not isinstance(rotations, list) or not rotations
                or not all(isinstance(r, int) and not isinstance(r, bool) for r in rotations)
                or len(set(rotations)) != len(rotations)):
            raise SettingsError(path, f"{where}.rotations_by_depth", depth,
                                f"{rotations!r} is not a non-empty list of distinct rotation numbers",
                                "list the rotations kept at that depth, e.g. [1]")
        out[depth] = tuple(sorted(rotations))
    return out


def _reduced_sampler(path: Path, where: str, spec: Any):
    """A reduced design's analysis sampler, checked as ``sampler`` is (None: the registered one)."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise SettingsError(path, where, "sampler", f"{spec!r} is not a mapping",
                            "write it as the sampler section's fields, e.g. {draws: 100, tune: 100, chains: 2}")
    return Sampler.from_mapping(path, f"{where}.sampler", spec)


def _reduced_max_extensions(path: Path, where: str, value: Any) -> int | None:
    """A reduced design's limit on the convergence remedy's extensions (None: the registered one)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SettingsError(path, where, "max_extensions", f"{value!r} is not a whole number >= 0",
                            "write how many extensions the remedy may run, e.g. 0 for none")
    return value


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
    if not isinstance(spec, Mapping):
        raise SettingsError(path, where, "<value>", f"{spec!r} is not a mapping",
                            f"write the family as a mapping of {', '.join(f.name for f in fields(Family) if f.name != 'key')}")
    unknown_keys(path, where, spec, [f.name for f in fields(Family) if f.name != "key"])
    depths = _need(path, spec, "depth_tokens", where, list)
    broken = _depth_tokens_rule_broken(depths)
    if broken:
        raise SettingsError(path, where, "depth_tokens", *broken)
    reduced = spec.get("reduced_design")
    reduced_design = None
    if reduced is not None:
        unknown_keys(path, f"{where}.reduced_design", _need(path, spec, "reduced_design", where, Mapping),
                     [f.name for f in fields(ReducedDesign)])
        here = f"{where}.reduced_design"
        optional = {name: reduced[name] for name in ("pilot_frames", "events_per_class", "scored_blocks")
                    if reduced.get(name) is not None}
        for name, kind in (("pilot_frames", list), ("events_per_class", int), ("scored_blocks", list)):
            if name in optional:
                _need(path, reduced, name, here, kind)
        power = reduced.get("power")
        if power is not None and not isinstance(power, Mapping):
            raise SettingsError(path, here, "power", f"{power!r} is not a mapping",
                                "write the rehearsal's reduced power simulation as power.demo's fields")
        reduced_design = ReducedDesign(
            reason=_need(path, reduced, "reason", here, str),
            confirmatory_frames_per_fear=_need(path, reduced, "confirmatory_frames_per_fear", here, int),
            pilot_frames=tuple(optional["pilot_frames"]) if "pilot_frames" in optional else None,
            events_per_class=optional.get("events_per_class"),
            scored_blocks=tuple(optional["scored_blocks"]) if "scored_blocks" in optional else None,
            branches=_branches(path, reduced.get("branches") or {}, here),
            examine_reserves=bool(reduced.get("examine_reserves", True)),
            rehearsal=bool(reduced.get("rehearsal", False)),
            power=PowerDemo.from_mapping(path, f"{here}.power", power) if power is not None else None,
            rotations_by_depth=_rotations_by_depth(path, reduced.get("rotations_by_depth") or {}, here, len(depths)),
            sampler=_reduced_sampler(path, here, reduced.get("sampler")),
            max_extensions=_reduced_max_extensions(path, here, reduced.get("max_extensions")),
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
    unknown_keys(path, where, spec, [f.name for f in fields(Block)])
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


#: Every top-level key the file may hold: the sections read here and the typed sections.
_TOP_LEVEL = ("protocol", "families", "names", "bank", "design", "models", "tokenizers",
              *(cls.NAME for cls in SECTIONS))


def _registered_blocks(path: Path, where: str, key: str, named, registered_blocks) -> None:
    """Every block a list names is registered under ``design.blocks``."""
    unknown = [b for b in named if b not in registered_blocks]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(registered_blocks), n=1)
        hint = f" (did you mean {close[0]!r} for {unknown[0]!r}?)" if close else ""
        raise SettingsError(path, where, key, f"unknown blocks {sorted(unknown)}",
                            f"name blocks registered under design.blocks{hint}")


def _band_fits_every_family(path: Path, rule: DepthBandRule, families: Mapping[str, Family]) -> None:
    """5: the fallback band is the ``min_depths`` depths closest to the target, so every family
    must register at least that many depths."""
    for family in families.values():
        if rule.min_depths > len(family.depth_tokens):
            raise SettingsError(path, "depth_band", "min_depths",
                                f"{rule.min_depths} is above family {family.key!r}'s {len(family.depth_tokens)} "
                                "depths, so its fallback band cannot be formed",
                                f"register at most {len(family.depth_tokens)} as depth_band.min_depths (5: two), "
                                f"or more depths under families.{family.key}.depth_tokens")


def _bank_rules(path: Path, bank: Mapping[str, Any]) -> BankRules:
    unknown_keys(path, "bank", bank, [f.name for f in fields(BankRules)])
    words = _need(path, bank, "function_words", "bank", list)
    bad = [w for w in words if not isinstance(w, str)]
    if bad:
        raise SettingsError(path, "bank", "function_words", f"non-text entries {bad!r}",
                            "quote every word: YAML reads on, off, no and yes as booleans")
    frame_sets = _need(path, bank, "frame_sets", "bank", Mapping)
    for key, span in frame_sets.items():
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)
                and span[0] <= span[1]):
            raise SettingsError(path, "bank.frame_sets", str(key), f"{span!r} is not a range [first, last]",
                                "write each set as [first, last] frame numbers, first <= last")
    texts = {}
    for key in ("fears", "event_classes"):
        values = _need(path, bank, key, "bank", list)
        if not all(isinstance(v, str) for v in values):
            raise SettingsError(path, "bank", key, f"{values!r} is not a list of texts", f"list bank.{key} as texts")
        texts[key] = tuple(values)
    return BankRules(fears=texts["fears"], frames_per_fear=_need(path, bank, "frames_per_fear", "bank", int),
                     frame_sets={k: list(v) for k, v in frame_sets.items()}, event_classes=texts["event_classes"],
                     events_per_class=_need(path, bank, "events_per_class", "bank", int), function_words=tuple(words),
                     verb_length_ratio_max=float(_need(path, bank, "verb_length_ratio_max", "bank", (int, float))))


def _rule(path: Path, design: Mapping[str, Any], key: str, cls: type) -> Mapping[str, Any]:
    """A design rule's mapping, with no key the rule does not define."""
    where = f"design.{key}"
    spec = _need(path, design, key, "design", Mapping)
    unknown_keys(path, where, spec, [f.name for f in fields(cls)])
    return spec


def _design(path: Path, design: Mapping[str, Any], cell_sets: Mapping[str, Any]) -> Design:
    orders = _need(path, design, "orders", "design", Mapping)
    option = _rule(path, design, "option_rule", OptionRule)
    first = _rule(path, design, "forced_choice_first_listed", FirstListedRule)
    judge = _rule(path, design, "judge_self_first", JudgeOrderRule)
    return Design(
        agents=tuple(design["agents"]), contents=tuple(design["contents"]),
        cell_sets={k: tuple(tuple(c) for c in v) for k, v in cell_sets.items()},
        orders={int(k): v for k, v in orders.items()},
        option_rule=OptionRule(
            rotation_order_index=_need(path, option, "rotation_order_index", "design.option_rule", str),
            option_when_even=_need(path, option, "option_when_even", "design.option_rule", int),
            option_when_odd=_need(path, option, "option_when_odd", "design.option_rule", int)),
        neutral_partner_option=_need(path, design, "neutral_partner_option", "design", int),
        forced_choice_first_listed=FirstListedRule(
            terms=tuple(_need(path, first, "terms", "design.forced_choice_first_listed", list)),
            first_when_even=_need(path, first, "first_when_even", "design.forced_choice_first_listed", int)),
        judge_self_first=JudgeOrderRule(
            terms=tuple(_need(path, judge, "terms", "design.judge_self_first", list)),
            self_first_when_even=_need(path, judge, "self_first_when_even", "design.judge_self_first", bool)),
        binding_in_context_documents=_need(path, design, "binding_in_context_documents", "design", int),
        confirmatory_frames_required=_need(path, design, "confirmatory_frames_required", "design", int),
    )


def _models(path: Path, raw: Mapping[str, Any]) -> dict[str, ModelEntry]:
    models = _need(path, raw, "models", "<top>", Mapping)
    out = {}
    for checkpoint, spec in models.items():
        where = f"models.{checkpoint}"
        if not isinstance(spec, Mapping):
            raise SettingsError(path, where, "<value>", "not a mapping", "write the entry as a mapping of fields")
        unknown_keys(path, where, spec, [f.name for f in fields(ModelEntry)])
        out[checkpoint] = ModelEntry(dtype=_need(path, spec, "dtype", where, str),
                                     context_window=_need(path, spec, "context_window", where, int),
                                     attn_implementation=_need(path, spec, "attn_implementation", where, str))
    return out


def _tokenizers(path: Path, raw: Mapping[str, Any]) -> dict[str, TokenizerEntry]:
    """4.2's registered tokenizers, each checked field by field."""
    section = raw.get("tokenizers")
    if not isinstance(section, Mapping) or not section:
        raise SettingsError(path, "<top>", "tokenizers", "missing or empty",
                            "register the tokenizers of the tested, judge and scorer models under 'tokenizers'")
    out: dict[str, TokenizerEntry] = {}
    owner: dict[str, str] = {}
    for key, spec in section.items():
        where = f"tokenizers.{key}"
        if not isinstance(spec, Mapping):
            raise SettingsError(path, where, "<value>", "not a mapping", "write the entry as a mapping of fields")
        unknown_keys(path, where, spec, [f.name for f in fields(TokenizerEntry) if f.name != "key"])
        values: dict[str, Any] = {}
        for name in ("source", "package", "version", "path", "format", "sha256", "message_prefix"):
            value = spec.get(name)
            if not isinstance(value, str) or (name != "message_prefix" and not value):
                raise SettingsError(path, where, name, f"expected text, got {value!r}",
                                    f"set '{where}.{name}' as quoted text (YAML reads unquoted digits as numbers)")
            values[name] = value
        if values["format"] not in TOKENIZER_FORMATS:
            raise SettingsError(path, where, "format", f"unknown format {values['format']!r}",
                                f"use one of {', '.join(TOKENIZER_FORMATS)}")
        if values["source"] not in TOKENIZER_SOURCES:
            raise SettingsError(path, where, "source", f"unknown source {values['source']!r}",
                                f"use one of {', '.join(TOKENIZER_SOURCES)}")
        if not re.fullmatch(r"[0-9a-f]{64}", values["sha256"]):
            raise SettingsError(path, where, "sha256", f"{values['sha256']!r} is not a full sha256",
                                "write the 64 lower-case hex digits of the file's sha256")
        checkpoints = spec.get("checkpoints")
        if not isinstance(checkpoints, list) or not checkpoints or not all(isinstance(c, str) for c in checkpoints):
            raise SettingsError(path, where, "checkpoints", f"expected a list of checkpoint ids, got {checkpoints!r}",
                                "list the checkpoints that use this tokenizer")
        for checkpoint in checkpoints:
            if checkpoint in owner:
                raise SettingsError(path, where, "checkpoints",
                                    f"{checkpoint!r} is also registered under tokenizers.{owner[checkpoint]}",
                                    "register each checkpoint under one tokenizer only")
            owner[checkpoint] = key
        out[key] = TokenizerEntry(key=key, checkpoints=tuple(checkpoints), **values)
    return out


def validate_settings(raw: Any, path: Path) -> ProtocolSettings:
    """The one validation of the settings file: every section typed, no unknown key at any
    level, and the rules across fields; the first problem raises a :class:`SettingsError`
    naming the file, the field and the fix."""
    if not isinstance(raw, Mapping):
        raise SettingsError(path, "<top>", "<document>", "not a mapping", "the file must be a YAML mapping of sections")
    unknown_keys(path, "<top>", raw, _TOP_LEVEL)
    for section in _REQUIRED_SECTIONS:
        _need(path, raw, section, "<top>", Mapping)
    if "mode" in raw["protocol"]:
        # Registering used to mean editing this frozen file; it is a record's issue now.
        raise SettingsError(path, "protocol", "mode", "mode is no longer a setting", MODE_NOT_A_SETTING)
    unknown_keys(path, "protocol", raw["protocol"], [f.name for f in fields(ProtocolInfo)])
    protocol = ProtocolInfo(name=_need(path, raw["protocol"], "name", "protocol", str),
                            version=_need(path, raw["protocol"], "version", "protocol", str),
                            master_seed=_need(path, raw["protocol"], "master_seed", "protocol", int))

    families = {key: _family(path, key, spec) for key, spec in raw["families"].items()}
    if not families:
        raise SettingsError(path, "families", "<mapping>", "no family registered", "register at least one family (D1)")

    names = raw["names"]
    unknown_keys(path, "names", names, [f.name for f in fields(Names)])
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
    name_rules = Names(registered_order=tuple(order), selected_count=count, roles_of_selected=tuple(roles),
                       rotations={int(k): tuple(v) for k, v in rotations.items()})
    for family in families.values():
        thinned = family.reduced_design.rotations_by_depth if family.reduced_design else {}
        for depth, kept in thinned.items():
            unregistered = [r for r in kept if r not in name_rules.rotations]
            if unregistered:
                raise SettingsError(path, f"families.{family.key}.reduced_design.rotations_by_depth", depth,
                                    f"rotation(s) {unregistered} are not registered (names.rotations: "
                                    f"{', '.join(map(str, sorted(name_rules.rotations)))})",
                                    "list registered rotation numbers only")
        built = {r for i in range(1, len(family.depth_tokens) + 1)
                 for r in family.rotations_at(i, tuple(name_rules.rotations))}
        if thinned and len(built) < 2:
            # 4.5: the probes are trained on the other rotations and read on the held-out one.
            raise SettingsError(path, f"families.{family.key}.reduced_design", "rotations_by_depth",
                                f"every depth is built at rotation {', '.join(map(str, sorted(built)))} only, and the "
                                "probes' leave-one-rotation-out folds need at least two rotations",
                                "keep at least two rotations at one depth or more")

    bank = _bank_rules(path, raw["bank"])

    design = raw["design"]
    unknown_keys(path, "design", design, [f.name for f in fields(Design)] + ["blocks"])
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
    block_names = [b.name for b in blocks]
    for family in families.values():
        if family.reduced_design:
            if family.reduced_design.scored_blocks is not None:
                _registered_blocks(path, f"families.{family.key}.reduced_design", "scored_blocks",
                                   family.reduced_design.scored_blocks, block_names)
            _registered_blocks(path, f"families.{family.key}.reduced_design", "branches",
                               family.reduced_design.branches, block_names)

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
    typed_design = _design(path, design, cell_sets)
    sections = {cls.NAME: cls.from_settings(path, raw) for cls in SECTIONS}
    _registered_blocks(path, "positive_controls", "pilot_blocks", sections["positive_controls"].pilot_blocks,
                       block_names)
    _band_fits_every_family(path, sections["depth_band"], families)
    return ProtocolSettings(raw=raw, path=path, protocol=protocol, families=families, name_rules=name_rules,
                            bank=bank, design=typed_design, blocks=blocks, models=_models(path, raw),
                            tokenizers=_tokenizers(path, raw), sections=sections)


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
