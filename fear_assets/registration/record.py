"""The Stage 1 registration record of one configuration (Appendix C step 4, D6).

A JSON document (and its Markdown rendering) under ``data/registration/<family>/`` holding
the frozen hashes (bank, protocol settings, model manifest, analysis code, supplementary
note), the selected names and frames, the depth band and H5 depth, the pilot's residual SDs
for gate (c), and every gate's outcome with its numbers. Once a record exists, every later run is compared
with its frozen part (:func:`frozen_differences`); any difference fails the freeze check.

A family's record is a draft that each pilot run rewrites until it is issued
(``registration.issue.issue_record``: status registered, the Stage 1 identifier, the time,
every frozen hash); from then on the family is confirmatory and its record is never
overwritten with different frozen values.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from fear_assets.core.errors import FreezeError
from fear_assets.core.hashing import sha256_file, sha256_obj
from fear_assets.core.numbers import yes_no
from fear_assets.registration.gate_table import gate_rows
from fear_assets.registration.gates import registered_power_result

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
#: What the registered code hash leaves out (Appendix C step 4 registers "the analysis code":
#: every function that decides a document, a score, a gate, a label or a reading). Everything
#: else in the package tree is hashed, so a new science package or module is covered without
#: being named; a test fails when an entry here is stale or names a science package. Each
#: entry only wires or runs steps and cannot change a number: the reason is stated beside it.
CODE_NOT_HASHED = {
    "defs": "the Dagster shell: assets, checks, resources, partitions, jobs, the instance's storage classes and "
            "the command line. Each asset body calls one function of a hashed stage package and adds metadata; "
            "a shape test fails if a Dagster module decides anything the hash must cover",
    "rehearsal": "rehearsal tooling: tiny random-weight stand-in checkpoints and the site file that places them, "
                 "for a dress rehearsal of the registered design; it decides no document, score, gate, label or "
                 "reading, and changing it must not change a registered family's code hash",
}
#: Fields that are frozen at registration and compared on every later run. The pilot sigmas
#: are frozen because 6.2 inserts "only the value of sigma ... at registration"; the
#: supplementary note's hash because the Declarations put it in the registered record.
FROZEN_FIELDS = ("settings_sha256", "bank_sha256", "manifest_sha256", "analysis_code_sha256", "selected_names",
                 "selected_frames", "depth_band", "h5_depth", "pilot_sigma", "pilot_sigma_judge",
                 "supplementary_note_sha256")
#: What issuing adds to a draft (``registration.issue``); a later run of the record asset on
#: the same frozen inputs keeps them.
ISSUE_FIELDS = ("stage1_id", "issued_at", "frozen_items", "rehearsal")


def _not_hashed(relative: Path) -> bool:
    """Wiring (``CODE_NOT_HASHED``), byte-code caches and hidden files (editor swap files)."""
    parts = relative.parts
    return (parts[0] in CODE_NOT_HASHED or "__pycache__" in parts or relative.suffix in (".pyc", ".pyo")
            or any(part.startswith(".") for part in parts))


def registered_code_files(root: Path | None = None) -> list[Path]:
    """Every file of the package tree under the registered code hash, sorted: all of it but
    ``CODE_NOT_HASHED`` (data files inside a package, such as a template, are hashed too)."""
    root = PACKAGE_ROOT if root is None else Path(root)
    return sorted(p for p in root.rglob("*") if p.is_file() and not _not_hashed(p.relative_to(root)))


def registered_code_hashes(root: Path | None = None) -> dict[str, str]:
    """Each registered code file's sha256 by its path under ``root`` (what an issued record
    keeps, so a refusal can name the file that changed)."""
    root = PACKAGE_ROOT if root is None else Path(root)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in registered_code_files(root)}


def analysis_code_sha256(root: Path | None = None) -> str:
    """sha256 over the registered code (``registered_code_files``), path by path. ``root`` is
    read when called (default: this package), so a check can be pointed at an edited copy."""
    return sha256_obj(registered_code_hashes(root))


def record_dir(registration_dir: str | Path, family: str) -> Path:
    return Path(registration_dir) / family


def read_family_record(registration_dir: str | Path, family: str) -> dict | None:
    path = record_dir(registration_dir, family) / "registration_record.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def frozen_differences(record: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Each frozen field whose current value differs from the record's (only fields the
    caller knows at that point are compared)."""
    out = []
    for key in FROZEN_FIELDS:
        if key in current and key in record and record[key] != current[key]:
            out.append(f"{key}: registered {_short(record[key])}, now {_short(current[key])}")
    return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:16] + "..." if isinstance(value, str) and len(value) == 64 else text


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def write_family_record(registration_dir: str | Path, record: Mapping[str, Any], confirmatory: bool) -> Path:
    """Write the JSON and Markdown record atomically. A registered (confirmatory) record is
    never overwritten with different frozen values: that is a new registration."""
    directory = record_dir(registration_dir, record["family"])
    existing = read_family_record(registration_dir, record["family"])
    if confirmatory and existing is not None and existing.get("status") == "registered":
        if record.get("status") != "registered":
            raise FreezeError(f"{directory}/registration_record.json is registered, and this run's record is "
                              f"{record.get('status')!r} (failed gates: {', '.join(record.get('failed_gates', []))}). "
                              "A registered record is never replaced by one that is not; fix the failing gates, or "
                              "file an amendment (move the old record aside).")
        diffs = frozen_differences(existing, record)
        if diffs:
            raise FreezeError(f"{directory}/registration_record.json is registered and differs: {'; '.join(diffs)}. "
                              "A registered record is never overwritten; restore the registered inputs or file "
                              "an amendment (move the old record aside) before writing a new one.")
        # The same frozen inputs again: the record keeps its issue (identifier, time, items).
        record = {**record, **{k: existing[k] for k in ISSUE_FIELDS if k in existing}}
    atomic_write(directory / "registration_record.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    atomic_write(directory / "registration_record.md", markdown(record))
    return directory / "registration_record.json"


def markdown(record: Mapping[str, Any]) -> str:
    """The record for a reader: frozen inputs, selections, then one line per gate."""
    lines = [f"# Registration record: {record['protocol']} ({record['protocol_version']}), family `{record['family']}`",
             "", f"Status: **{record['status']}** (mode `{record['mode']}`)."]
    if record.get("rehearsal"):
        lines += ["", f"**{record['rehearsal']}**"]
    if record.get("stage1_id"):
        lines += ["", f"Issued {record.get('issued_at', '')} as Stage 1 `{record['stage1_id']}`."]
    if record.get("stand_in"):
        lines += ["", f"Note: {record['stand_in']}"]
    if record.get("reduced_design"):
        lines += ["", f"Reduced design: {record['reduced_design']}"]
    lines += ["", "## Frozen inputs", "", "| input | sha256 |", "|---|---|"]
    for key in ("settings_sha256", "bank_sha256", "manifest_sha256", "analysis_code_sha256"):
        lines.append(f"| {key.removesuffix('_sha256')} | `{record[key]}` |")
    if "supplementary_note_sha256" in record:
        note = record["supplementary_note_sha256"]
        lines.append(f"| supplementary note ({record.get('supplementary_note', '')}) | "
                     + (f"`{note}` |" if note else "**not provided** (required to register) |"))
    lines += ["", "## Selections", "",
              f"- Names (self, peer, person, addressee, other person): {', '.join(record['selected_names'])}",
              f"- Depth band (H1-H4): {', '.join('d' + str(d) for d in record['depth_band'])} ({record['band_rule']})",
              f"- H5 depth: d{record['h5_depth']} ({record['h5_rule']})",
              f"- Pilot residual SD (gate (c) scale): "
              + (str(record['pilot_sigma']) if record['pilot_sigma'] is not None else "not finite (gate_c_scale)")
              + (f"; judge {record['pilot_sigma_judge']}" if record.get("pilot_sigma_judge") is not None else ""),
              f"- Confirmatory frames ({len(record['selected_frames'])}): {', '.join(record['selected_frames'])}"]
    if record.get("replacements"):
        lines.append(f"- Replacements: {', '.join(f'{k} -> {v}' for k, v in record['replacements'].items())}")
    lines += ["", "## Gates", "", "| gate | outcome | numbers | finding | fix |", "|---|---|---|---|---|"]
    for row, gate in zip(gate_rows(record["gates"]).itertuples(), record["gates"].values()):
        outcome = row.outcome if gate["passed"] else f"**{row.outcome}**"
        cells = [str(c).replace("|", "/").replace("\n", " ") for c in
                 (row.gate, outcome, row.numbers, gate["message"], row.fix)]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [n for n, g in record["gates"].items() if not g["passed"]]
    lines += ["", f"Failed gates: {', '.join(failed) if failed else 'none'}."]
    carried = []
    if record.get("binding_in_context"):
        b = record["binding_in_context"]
        carried.append(f"- In-context binding (4.2): {b['correct']}/{b['documents']}, "
                       f"{'passes' if b['passed'] else '**below the registered rate: H2-H5 uninterpretable (D5 row 2)**'}"
                       f" ({b['message']})")
    if "power" in record:
        power = record["power"]
        carried.append("- Power simulation (6.3): " + (
            f"gates underpowered: {yes_no(power['gates_underpowered'])}" if registered_power_result(power) else
            "**not run**: every reading carries `power_gate_not_run`"
            + ("" if power is None else " (the stored result is a reduced demo or incomplete)")))
    if carried:
        lines += ["", "## Carried to the Section 8 reading", "", *carried]
    if record.get("deviations"):
        lines += ["", "## Deviations from the protocol's wording", "",
                  "| section | protocol | implemented | why |", "|---|---|---|---|"]
        lines += [f"| {d['section']} | {d['protocol']} | {d['implemented']} | {d['why']} |".replace("\n", " ")
                  for d in record["deviations"]]
    lines += power_markdown(record.get("power"))
    return "\n".join(lines) + "\n"


# --- power gate (6.3, issue 11) --------------------------------------------------------
POWER_FILE = "power_summary.json"


def write_power_section(registration_dir: str | Path, family: str, section: Mapping[str, Any]) -> Path:
    """The power simulation's results, beside the record; ``registration_record`` embeds them."""
    path = record_dir(registration_dir, family) / POWER_FILE
    atomic_write(path, json.dumps(section, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_power_section(registration_dir: str | Path, family: str) -> dict | None:
    path = record_dir(registration_dir, family) / POWER_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def power_markdown(power: Mapping[str, Any] | None) -> list[str]:
    """The record's power section for a reader: status, frames, decisions, then each target."""
    if not power:
        return ["", "## Power gate (6.3)", "", "Not run."]
    lines = ["", "## Power gate (6.3)", ""]
    if power.get("demo"):
        lines += [f"**{power['note']}**", ""]
    lines += [f"- Status: {power['status']}; frames: {power['frames']} (simulated: {power['frames_simulated']})",
              f"- Estimation-only: {', '.join(power['estimation_only']) or 'none'}; joint shortfall source: "
              f"{power['joint_shortfall_source'] or 'none'}; gates underpowered: "
              f"{yes_no(power['gates_underpowered']) if registered_power_result(power) else 'not decided (demo or incomplete)'}",
              f"- Fits: {power['fits']}, of which {power['fits_missing_convergence_rule']} miss the convergence rule "
              "(kept; rates without them are in the label frequencies)",
              f"- Not simulated: {'; '.join(f'{k}: {v}' for k, v in power['not_simulated'].items()) or 'none'}",
              f"- Frame effects (D3b, the registered rule per dataset): "
              f"{power.get('frame_parametrisation', {}).get('primary_fits_by_form') or 'not recorded'}",
              f"- Samplers (simulated datasets; the accelerator path is a recorded change of the registered "
              f"sampler): {', '.join(f'{k} {v}' for k, v in (power.get('samplers') or {}).items()) or 'not recorded'}",
              "", "| target | frames | rate | MC SE | n | bound | met |", "|---|---|---|---|---|---|---|"]
    for t in power["targets"]:
        rate = "n/a" if t["n"] == 0 else f"{t['rate']:.3f}"
        se = "n/a" if t["n"] == 0 else f"{t['mcse']:.3f}"
        met = {True: "yes", False: "**no**", None: "not computable"}[t["met"]]
        lines.append(f"| {t['target']} | {t['frames']} | {rate} | {se} | {t['n']} | "
                     f"{'>=' if t['kind'] == 'min' else '<='} {t['bound']} | {met} |")
    return lines


def registered_replacements(registration_dir: str | Path, family: str) -> dict[str, str]:
    """Frame replacements of a registered record (frame -> rewrite or reserve); a pilot's
    draft record changes the design of nothing."""
    return replacements_of(read_family_record(registration_dir, family))


def replacements_of(record: Mapping[str, Any] | None) -> dict[str, str]:
    """Frame replacements a record puts into the confirmatory design (4.3): those of a
    registered record; a pilot's draft (or a refused record) changes the design of nothing."""
    return dict(record.get("replacements", {})) if record and record.get("status") == "registered" else {}
