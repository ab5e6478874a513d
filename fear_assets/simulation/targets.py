"""The registered targets and rules of the power gate (protocol 6.3, D7), as pure functions
of stored labels (one row per dataset and reported contrast, ``runner.LABEL_COLUMNS``).

Targets, each read from the point estimate of its rate and reported with its binomial Monte
Carlo standard error, sqrt(p (1 - p) / n):
- every confirmatory hypothesis (H1-H5) and gates (a) and (c): Supported in >= 90% of datasets
  at the meaningful size and in <= 2.5% at zero;
- H2 and H5: Practically equivalent in >= 80% at zero;
- gate (b): passing (neither Practically equivalent nor Contrary) in >= 90% at the meaningful
  size; its Unresolved rate at zero is reported;
- the joint probability of the top Section 8 reading (controls passing included) >= 80% with
  every effect at its meaningful size and <= 2.5% with every effect at zero.
Reported without a target: every label's frequency at the SESOI, and the false-positive rate
of the five hypotheses together (any Supported at zero). A contrast that was not simulated
gives ``met = None``, never a pass. Fits that missed the convergence rule are kept; each rate
is also reported without them (subset ``converged``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from fear_assets.models.decision import ESTIMATION_ONLY
from fear_assets.reading.decision import READINGS, section8_reading

HYPOTHESES = ("H1", "H2", "H3", "H4", "H5")
GATES = ("gate_a", "gate_b", "gate_c")
CONTROLS = ("control_addressee_name", "control_instructed_interaction", "control_instructed_priority",
            "control_marked_priority")
TOP = READINGS[10]  # CONSISTENT_WITH_FRAMEWORK
TOP_H5_ESTIMATION_ONLY = READINGS[12]  # 6.3: the joint target when H5 is estimation-only
SOURCES = ("gates", "H5", "controls")  # 6.3's order of the traceable sources


@dataclass(frozen=True)
class PowerTargets:
    """6.3's registered bounds (from the protocol settings' ``power`` section)."""

    supported_at_meaningful_min: float
    supported_at_zero_max: float
    equivalent_at_zero_min: float
    gate_b_pass_min: float
    joint_top_reading_min: float
    joint_top_reading_zero_max: float
    frames_start: int
    frame_block: int
    frames_max: int

    @classmethod
    def from_settings(cls, settings) -> "PowerTargets":
        p = settings.power
        return cls(p.supported_at_meaningful_min, p.supported_at_zero_max, p.equivalent_at_zero_min,
                   p.gate_b_pass_min, p.joint_top_reading_min, p.joint_top_reading_zero_max,
                   int(settings.design.confirmatory_frames_required), p.frame_block, p.frames_max)


def mcse(rate: float, n: int) -> float:
    """Binomial Monte Carlo standard error of a rate from ``n`` datasets."""
    return float(np.sqrt(rate * (1.0 - rate) / n)) if n else float("nan")


def label_frequencies(labels: pd.DataFrame) -> pd.DataFrame:
    """Frequency of each label per contrast, scenario and frame count, with its MCSE; over all
    fits (subset ``all``) and over fits meeting the convergence rule (``converged``)."""
    out = []
    for subset, data in (("all", labels), ("converged", labels[labels["converged"].astype(bool)])):
        for (contrast, scenario, frames), g in data.groupby(["contrast", "scenario", "frames"], sort=True):
            n = len(g)
            for lab, count in g["label"].value_counts().sort_index().items():
                rate = count / n
                out.append({"subset": subset, "contrast": contrast, "scenario": scenario, "frames": int(frames),
                            "label": lab, "count": int(count), "n": n, "rate": rate, "mcse": mcse(rate, n)})
    return pd.DataFrame(out, columns=["subset", "contrast", "scenario", "frames", "label", "count", "n", "rate",
                                      "mcse"])


def _rate(values: pd.Series) -> tuple[float, float, int]:
    n = int(len(values))
    rate = float(values.mean()) if n else float("nan")
    return rate, mcse(rate, n), n


def dataset_readings(labels: pd.DataFrame, h5_estimation_only: bool = False,
                     neutral: str | None = None) -> pd.DataFrame:
    """The Section 8 reading each dataset would get (binding assumed to pass, gates not made
    descriptive), one row per (scenario, frames, dataset); ``reading`` is None where a
    component it needs was not simulated. ``neutral`` (one of ``SOURCES``) sets that source's
    components to passing: the counterfactual the shortfall rule uses."""
    wide = labels.pivot_table(index=["scenario", "frames", "dataset"], columns="contrast", values="label",
                              aggfunc="first")
    passed = labels[labels["contrast"].str.startswith("control_")].pivot_table(
        index=["scenario", "frames", "dataset"], columns="contrast", values="control_passed", aggfunc="first")
    need = ["H2", "gate_a", "gate_b", "gate_c"] + ([] if h5_estimation_only else ["H5"])
    rows = []
    for key, row in wide.iterrows():
        labs = {c: row.get(c) for c in need}
        ctrl = {c: (passed.loc[key, c] if c in passed.columns else None) for c in CONTROLS}
        if neutral == "gates":
            labs.update(gate_a="supported", gate_b="supported", gate_c="supported")
        if neutral == "H5" and not h5_estimation_only:
            labs["H5"] = "supported"
        if neutral == "controls":
            ctrl = {c: True for c in CONTROLS}
        missing = [c for c, v in labs.items() if not isinstance(v, str)] + \
                  [c for c, v in ctrl.items() if v is None or (isinstance(v, float) and np.isnan(v))]
        reading = None
        if not missing:
            reading = section8_reading(labs["H2"], ESTIMATION_ONLY if h5_estimation_only else labs["H5"],
                                       labs["gate_a"], labs["gate_b"], labs["gate_c"],
                                       controls_failed=not all(bool(v) for v in ctrl.values()),
                                       binding_failed=False, gates_underpowered=False).code
        rows.append({"scenario": key[0], "frames": int(key[1]), "dataset": int(key[2]), "reading": reading,
                     "missing": ", ".join(sorted(missing))})
    return pd.DataFrame(rows, columns=["scenario", "frames", "dataset", "reading", "missing"])


def _target(name: str, contrast: str, scenario: str, frames: int, statistic: str, bound: float, kind: str,
            values: pd.Series | None, why_missing: str = "") -> dict:
    if values is None or values.empty:
        return {"target": name, "contrast": contrast, "scenario": scenario, "frames": frames, "statistic": statistic,
                "rate": float("nan"), "mcse": float("nan"), "n": 0, "bound": bound, "kind": kind, "met": None,
                "note": why_missing or "not simulated"}
    rate, se, n = _rate(values.astype(float))
    met = rate >= bound if kind == "min" else rate <= bound
    return {"target": name, "contrast": contrast, "scenario": scenario, "frames": frames, "statistic": statistic,
            "rate": rate, "mcse": se, "n": n, "bound": bound, "kind": kind, "met": bool(met), "note": ""}


def targets(labels: pd.DataFrame, t: PowerTargets, frames: int, h5_estimation_only: bool = False,
            not_simulated: Mapping[str, str] | None = None) -> list[dict]:
    """Every registered target of 6.3 at one frame count (one dict per target)."""
    not_simulated = dict(not_simulated or {})
    at = labels[labels["frames"] == frames]

    def lab(contrast: str, scenario: str) -> pd.Series | None:
        g = at[(at["contrast"] == contrast) & (at["scenario"] == scenario)]
        return g["label"] if len(g) else None

    out = []
    for c in (*HYPOTHESES, "gate_a", "gate_c"):
        why = not_simulated.get(c, "")
        m, z = lab(c, "meaningful"), lab(c, "null")
        out.append(_target(f"{c} Supported at the meaningful size", c, "meaningful", frames, "supported",
                           t.supported_at_meaningful_min, "min", None if m is None else m == "supported", why))
        out.append(_target(f"{c} Supported at zero", c, "null", frames, "supported", t.supported_at_zero_max, "max",
                           None if z is None else z == "supported", why))
    for c in ("H2", "H5"):
        z = lab(c, "null")
        out.append(_target(f"{c} Practically equivalent at zero", c, "null", frames, "practically_equivalent",
                           t.equivalent_at_zero_min, "min", None if z is None else z == "practically_equivalent",
                           not_simulated.get(c, "")))
    m = lab("gate_b", "meaningful")
    out.append(_target("gate_b passing at the meaningful size", "gate_b", "meaningful", frames, "passing",
                       t.gate_b_pass_min, "min",
                       None if m is None else ~m.isin(["practically_equivalent", "contrary"]),
                       not_simulated.get("gate_b", "")))
    top = TOP_H5_ESTIMATION_ONLY if h5_estimation_only else TOP
    readings = dataset_readings(at, h5_estimation_only) if len(at) else None
    for scenario, bound, kind in (("meaningful", t.joint_top_reading_min, "min"),
                                  ("null", t.joint_top_reading_zero_max, "max")):
        values, why = None, ""
        if readings is not None:
            r = readings[readings["scenario"] == scenario]
            if len(r) and r["reading"].notna().all():
                values = r["reading"] == top
            elif len(r):
                why = "needs " + r["missing"].iloc[0] + " (" + "; ".join(
                    f"{k}: {v}" for k, v in not_simulated.items() if k in r["missing"].iloc[0]) + ")"
        out.append(_target(f"joint {top} at {scenario}", "joint", scenario, frames, top, bound, kind, values, why))
    return out


def reported(labels: pd.DataFrame, frames: int) -> list[dict]:
    """Reported without a target: gate (b) Unresolved at zero; the five hypotheses' joint
    false-positive rate at zero (those simulated)."""
    at = labels[labels["frames"] == frames]
    out = []
    z = at[(at["contrast"] == "gate_b") & (at["scenario"] == "null")]
    if len(z):
        rate, se, n = _rate((z["label"] == "unresolved").astype(float))
        out.append({"statistic": "gate_b Unresolved at zero", "rate": rate, "mcse": se, "n": n})
    h = at[at["contrast"].isin(HYPOTHESES) & (at["scenario"] == "null")]
    if len(h):
        anyfp = h.groupby("dataset")["label"].apply(lambda s: (s == "supported").any())
        rate, se, n = _rate(anyfp.astype(float))
        present = ", ".join(sorted(h["contrast"].unique()))
        out.append({"statistic": f"any of {present} Supported at zero (false-positive rate together)",
                    "rate": rate, "mcse": se, "n": n})
    return out


def trace_shortfall(labels: pd.DataFrame, t: PowerTargets, frames: int, h5_estimation_only: bool = False) -> str:
    """6.3's fixed rule for a missed joint target at the meaningful size: each source in the
    protocol's order (gates, H5, controls) is set to passing in turn; the source is the first
    whose neutralisation alone reaches the target, otherwise the one that raises the joint
    rate most (ties in that order). ``"H2"`` when even H2 misses its own 90% target, which no
    source can repair."""
    at = labels[(labels["frames"] == frames) & (labels["scenario"] == "meaningful")]
    h2 = at[at["contrast"] == "H2"]["label"]
    if len(h2) and (h2 == "supported").mean() < t.supported_at_meaningful_min:
        return "H2"
    top = TOP_H5_ESTIMATION_ONLY if h5_estimation_only else TOP
    rates = {}
    for source in SOURCES:
        if source == "H5" and h5_estimation_only:
            continue
        r = dataset_readings(at, h5_estimation_only, neutral=source)
        rates[source] = float((r["reading"] == top).mean()) if r["reading"].notna().all() else float("nan")
    for source, rate in rates.items():
        if rate >= t.joint_top_reading_min:
            return source
    known = {s: r for s, r in rates.items() if not np.isnan(r)}
    return max(known, key=lambda s: (known[s], -SOURCES.index(s))) if known else "unknown"


def frame_sequence(t: PowerTargets) -> list[int]:
    """50, 60, ... 100: frames are added in blocks of 10 up to 100 (4.7, 6.3)."""
    return list(range(t.frames_start, t.frames_max + 1, t.frame_block))


def decide(labels: pd.DataFrame, t: PowerTargets, not_simulated: Mapping[str, str] | None = None) -> dict:
    """The power gate's decision for one family from all its stored labels: the frame count
    (the first in 50, 60, ... 100 at which every target is met, else 100), the hypotheses
    still short there (estimation-only), the traced source of a joint shortfall and what it
    implies (gates descriptive -> ``gates_underpowered``; H5 estimation-only and the joint
    target recomputed for "use unresolved or not tested"; controls strengthened once), and
    the next frame count to simulate when the sequence has not reached a decision."""
    simulated = sorted(int(f) for f in labels["frames"].unique()) if len(labels) else []
    chosen, next_frames, table = None, None, []
    for f in frame_sequence(t):
        if f not in simulated:
            next_frames = f
            break
        rows = targets(labels, t, f, not_simulated=not_simulated)
        table += rows
        if not any(r["met"] is False for r in rows) or f == t.frames_max:
            chosen = f
            break
    out = {"frames_simulated": simulated, "targets": table, "frames": chosen, "next_frames": next_frames,
           "estimation_only": [], "joint_shortfall_source": None, "gates_underpowered": False,
           "h5_estimation_only": False, "controls_to_strengthen": False, "reported": [],
           "not_simulated": dict(not_simulated or {})}
    if chosen is None:
        out["status"] = "incomplete: simulate frame count " + str(next_frames)
        out["passed"] = False
        # The last frame count simulated missed a target (else it would be the decision).
        out["targets"] = required_targets(table, simulated[-1] if simulated else None, [], False, None)
        return out
    at = [r for r in table if r["frames"] == chosen]
    missed = [r for r in at if r["met"] is False]
    out["estimation_only"] = sorted({r["contrast"] for r in missed if r["contrast"] in HYPOTHESES})
    # 6.3 states in advance that H5 missing its own targets at 100 frames makes the top reading
    # "use unresolved or not tested": H5 is then estimation-only and the joint target is read for
    # row 12, as when H5 is the traced source of a joint shortfall.
    h5_estimation_only = "H5" in out["estimation_only"]
    joint_rows = [r for r in at if r["contrast"] == "joint"]
    if h5_estimation_only:
        joint_rows = h5_joint_rows(labels, t, chosen, not_simulated)
        out["targets"] += joint_rows
    joint_missed = any(r["scenario"] == "meaningful" and r["met"] is False for r in joint_rows)
    if joint_missed:
        source = trace_shortfall(labels, t, chosen, h5_estimation_only)
        out["joint_shortfall_source"] = source
        out["gates_underpowered"] = source == "gates"
        out["controls_to_strengthen"] = source == "controls"
        if source == "H5":
            h5_estimation_only = True
            out["estimation_only"] = sorted(set(out["estimation_only"]) | {"H5"})
            out["targets"] += h5_joint_rows(labels, t, chosen, not_simulated)
    out["h5_estimation_only"] = h5_estimation_only
    out["reported"] = reported(labels, chosen)
    unknown = [r["target"] for r in at if r["met"] is None]
    out["status"] = ("complete" if not unknown else
                     f"partial: {len(unknown)} target(s) not computable (components not simulated)")
    out["passed"] = not unknown and not missed
    out["targets"] = required_targets(out["targets"], chosen, out["estimation_only"], h5_estimation_only,
                                      out["joint_shortfall_source"])
    return out


def required_targets(rows: list[dict], frames: int | None, estimation_only: list[str], h5_estimation_only: bool,
                     shortfall_source: str | None) -> list[dict]:
    """``rows`` with ``required``: whether 6.3's power gate needs the target met, by its fixed
    rules. Only the decided frame count counts (a count that missed, followed by 10 more
    frames, is history); "any hypothesis still below target is declared estimation-only
    before collection", not a failure; when H5 is estimation-only the joint target is the one
    "computed for the 'Use Unresolved or Not Tested' reading"; a joint shortfall traced to the
    gates makes them descriptive (their targets and the joint one no longer gate). A shortfall
    traced to the controls stays required: they are strengthened once, else not run."""
    out = []
    for r in rows:
        required = frames is not None and r["frames"] == frames and r["contrast"] not in estimation_only
        if r["contrast"] == "joint" and h5_estimation_only:
            required = required and r["target"].endswith("(H5 estimation-only)")
        if shortfall_source == "gates" and (r["contrast"] == "joint" or r["contrast"].startswith("gate_")):
            required = False
        out.append({**r, "required": bool(required)})
    return out


def h5_joint_rows(labels: pd.DataFrame, t: PowerTargets, frames: int,
                  not_simulated: Mapping[str, str] | None) -> list[dict]:
    """The joint targets recomputed for "use unresolved or not tested" (H5 estimation-only, 6.3)."""
    return [r | {"target": r["target"] + " (H5 estimation-only)"}
            for r in targets(labels, t, frames, h5_estimation_only=True, not_simulated=not_simulated)
            if r["contrast"] == "joint"]


def gates_underpowered(power: Mapping | None) -> bool:
    """The reading's ``gates_underpowered`` flag (D5 row 7) from a power decision (the record's
    ``power`` section): true only when the gate traced a joint shortfall to the gates."""
    return bool(power and power.get("gates_underpowered", False))
