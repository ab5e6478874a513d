"""The power gate's steps (protocol 6.3, Appendix C step 3; D7), each ``(stored inputs,
registered view) -> result`` with the table and the facts its step shows: the pilot
estimates, one simulated batch, and the summary with its targets (written to the
registration record's power section)."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from fear_assets.analysis.h4 import h4_data
from fear_assets.design.unmasking import unmask_pilot
from fear_assets.core.registered import Registered
from fear_assets.core.settings import DepthBand, depth_key
from fear_assets.models.data import model_table
from fear_assets.models.fits import fit_cells
from fear_assets.models.h5_model import H5Priors
from fear_assets.models.primary_model import Priors
from fear_assets.pilot.depth_rules import stored_band
from fear_assets.registration.record import write_power_section
from fear_assets.simulation.batches import batch_keys_of
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import NOT_SIMULATED, PRIMARY_MODEL_BLOCKS, PilotEstimates, pilot_estimates
from fear_assets.simulation.models import h4_pilot_fit, h5_pilot_estimates, h5_pilot_rows
from fear_assets.simulation.pilot_scales import judge_note, pilot_judge_sigma, recall_pilot_fit
from fear_assets.simulation.runner import Rules, run_batch, run_batch_accelerated
from fear_assets.simulation.sampler_path import ACCELERATOR, NUTPIE_LOOP, SamplerPath
from fear_assets.simulation.sampling import frame_forms_record
from fear_assets.simulation.setup import fitter_for, run_key
from fear_assets.simulation.store import batch_path, parse_batch_key, read_batches, write_batch
from fear_assets.simulation.targets import PowerTargets, decide, label_frequencies


@dataclass(frozen=True)
class PilotEstimatesResult:
    """The stored pilot estimates (one row) and what the step shows."""

    table: pd.DataFrame
    band: tuple[str, ...]
    pilot_trials: int
    estimates: PilotEstimates
    controls: dict[str, float]
    #: Where gate (b)'s and gate (c)'s judge scales come from (the pilot's, or the stated fallback).
    gate_b_source: str = ""
    judge_source: str = ""


def power_pilot_estimates(view: Registered, bank, pilot_scores: pd.DataFrame, assignment_key: pd.DataFrame,
                          sentence_surprisal: pd.DataFrame, pilot_depths: pd.DataFrame,
                          pilot_controls: pd.DataFrame, pilot_probe_outputs: pd.DataFrame) -> PilotEstimatesResult:
    """6.3: the pilot estimates the simulation generates from: posterior means of the registered
    primary model on the pilot frames (the demo family: with the demo's shorter sampler), the
    spread of the two surprisal covariates, the pilot contrasts of the positive controls, gate
    (b)'s recall fit and the judge's residual SD (``pilot_scales``), and (a registered family)
    H4's model on the pilot probe and H5's probit on the pilot's forced choices."""
    settings, family_key = view.settings, view.family.key
    band = stored_band(pilot_depths).keys
    rows = pilot_scores[pilot_scores["block"] == "pilot_primary"]
    fears_of = {i: bank.item(i).group for i in set(rows["item_id"])}
    table = model_table(unmask_pilot(rows, assignment_key), sentence_surprisal, fears_of,
                        settings.neutral_partner_option)
    fit = fit_cells(fitter_for(settings, family_key), table, settings.fears, band,
                    view.seed("power_pilot_estimates", family_key), "pilot_primary")
    controls = {str(r.control): (0.0 if pd.isna(r.mean) else float(r.mean)) for r in pilot_controls.itertuples()}
    # Gate (b) and gate (c)'s judge at their own pilot scales (6.3), each with its stated fallback.
    recall = recall_pilot_fit(fitter_for(settings, family_key), table, settings.fears, band,
                              view.seed("power_pilot_recall", family_key))
    judge_sigma = pilot_judge_sigma(pilot_controls)
    h5_index = pilot_depths["h5_depth"].iloc[0]
    h5_depth = None if pd.isna(h5_index) else depth_key(int(h5_index))  # 5: H5's registered depth
    est = dataclasses.replace(pilot_estimates(fit.idata, fit.data, controls), recall=recall.estimates,
                              judge_sigma=judge_sigma, h5_depth=h5_depth)
    if not view.embedded:  # H4's and H5's models at the pilot (the demo fits neither)
        s = view.power_sampler
        removed = pilot_scores[pilot_scores["block"] == "pilot_content_removed"]  # the criterion's baseline (4.5)
        h5_rows = h5_pilot_rows(unmask_pilot(rows, assignment_key), h5_depth,
                                unmask_pilot(removed, assignment_key) if len(removed) else None)
        h5 = h5_pilot_estimates(h5_rows, H5Priors.from_settings(settings), int(s.draws), int(s.tune),
                                int(s.chains), view.seed("power_pilot_h5", family_key))
        probe = unmask_pilot(pilot_probe_outputs[pilot_probe_outputs["frame_set"] == "pilot"], assignment_key)
        h4_table = h4_data(probe, sentence_surprisal, {i: bank.item(i).group for i in set(probe["item_id"])},
                           settings.neutral_partner_option)
        h4 = h4_pilot_fit(h4_table, settings.fears, Priors.from_settings(settings), int(s.draws), int(s.tune),
                          int(s.chains), view.seed("power_pilot_h4", family_key))
        est = dataclasses.replace(est, h4=h4, h5=h5.as_dict())
    judge = judge_note(judge_sigma, pilot_controls)
    out = pd.DataFrame([{"family": family_key, "estimates_json": json.dumps(est.as_dict(), sort_keys=True),
                         "band": ",".join(band), "pilot_trials": len(table), "max_rhat": fit.diagnostics["max_rhat"],
                         "recall_trials": recall.trials, "recall_max_rhat": recall.max_rhat,
                         "gate_b_source": recall.note, "judge_source": judge}])
    return PilotEstimatesResult(out, tuple(band), len(table), est, controls, recall.note, judge)


@dataclass(frozen=True)
class BatchResult:
    """One simulated batch: its Parquet file and, where fitted now, its labels and facts."""

    path: Path
    resumed: bool
    labels: pd.DataFrame | None = None
    datasets: int = 0
    rows: object = None
    seconds: float = 0.0
    compilations: int = 0
    #: The path the batch was fitted on, why, the sampler's settings and its validation's
    #: status (``sampler_record``).
    sampler: dict = dataclasses.field(default_factory=dict)

    @property
    def frame_forms(self) -> dict[str, int]:
        """Datasets per frame-effect form the registered rule picked (one count per dataset)."""
        return (self.labels.drop_duplicates(["dataset", "frame_parametrisation"])["frame_parametrisation"].dropna()
                .value_counts().to_dict())

    @property
    def not_converged(self) -> int:
        """Fits of this batch that miss the convergence rule."""
        return int((~self.labels["converged"]).sum())

    @property
    def label_counts(self) -> pd.DataFrame:
        """Datasets per contrast and label."""
        return self.labels.groupby(["contrast", "label"]).size().rename("datasets").reset_index()


def batch_file(view: Registered, power_dir: Path, key: str, estimates: pd.DataFrame) -> Path:
    """The Parquet file of batch ``key`` under its run key; a key that is not one of the family's
    batches is a ValueError naming the family's batches."""
    family_key = view.family.key
    keys = batch_keys_of(view.settings, family_key)
    if key not in keys:
        raise ValueError(f"batch {key} is not part of family {family_key}'s simulation "
                         f"(its batches: {keys[:3]} ...): pick one of those")
    return batch_path(power_dir, family_key, key, run_key(view.settings, family_key, estimates))


def batch_design(view: Registered, est: PilotEstimates, band, frames: int):
    """The design every dataset of a batch at ``frames`` frames is simulated on (6.3): the
    family's depths, ``band`` for H1-H3, H5's forced choices at the pilot's registered H5 depth
    (``est.h5_depth``; estimates stored before it was recorded: the band's deepest), and a
    reduced design's thinned depths as the family builds them."""
    settings = view.settings
    rotations_at = {i: view.family.rotations_at(i, settings.rotations) for i in range(1, view.family.deepest_index + 1)}
    return simulated_design(settings, view.family.depth_keys, band, frames, est.covariate_sd,
                            view.seed("power", view.family.key, "design", frames, 0, "covariates"),
                            h5_depth=est.h5_depth, rotations_at=rotations_at)


def sampler_record(view: Registered, route: SamplerPath | None) -> dict:
    """What a batch records of its sampler: the path, why, the settings it ran under (the
    registered nutpie ``sampler`` of the family's power fits, or ``simulation_sampler``) and
    the accelerator path's validation status."""
    if route is None or not route.accelerated:
        s = view.power_sampler
        return {"path": NUTPIE_LOOP, "reason": route.reason if route else "the registered sampler",
                "settings": {"draws": int(s.draws), "tune": int(s.tune), "chains": int(s.chains)},
                "validation": "not needed (the registered sampler)"}
    return {"path": ACCELERATOR, "reason": route.reason, "settings": dict(vars(view.simulation_sampler)),
            "validation": route.validation.as_text()}


def power_batch(view: Registered, key: str, estimates: pd.DataFrame, power_dir: Path,
                log: Callable[[str], None] = print, route: Callable[[], SamplerPath] | None = None) -> BatchResult:
    """6.3: one batch of simulated datasets on the registered design at its frame count, each
    fitted under exactly the registered priors; labels, HDIs and every fit's diagnostics go to
    one Parquet file (atomic). A batch whose file exists is finished and is not refitted.
    ``route`` (None: the nutpie loop) is asked only for a batch to fit (``sampler_path.choose_path``:
    the host's choice, its GPU and validation) and says whether its datasets are fitted together
    on the accelerator path."""
    settings, family_key = view.settings, view.family.key
    path = batch_file(view, power_dir, key, estimates)
    if path.exists():
        return BatchResult(path, True)
    scenario, frames, batch = parse_batch_key(key)
    size = view.power.batch_size
    datasets = range(batch * size, min(view.power_datasets, (batch + 1) * size))
    est = PilotEstimates.from_dict(json.loads(estimates["estimates_json"].iloc[0]))
    design = batch_design(view, est, DepthBand.parse(estimates["band"].iloc[0]).keys, frames)
    t = time.perf_counter()
    reduced = view.power_reduction
    blocks = reduced.blocks if reduced is not None else tuple(PRIMARY_MODEL_BLOCKS)
    chosen = route() if route is not None else None
    record = sampler_record(view, chosen)
    if chosen is not None and chosen.accelerated:
        labels, programs = run_batch_accelerated(
            design, est, Rules.from_settings(settings), Priors.from_settings(settings),
            view.frame_parametrisation, view.simulation_sampler, view.convergence_remedy.max_extensions,
            family_key, scenario, datasets, view.master_seed, log=log, blocks=blocks)
        compilations = sum(len(p) for p in programs.values())
    else:
        fitter = fitter_for(settings, family_key)
        labels = run_batch(fitter, design, est, Rules.from_settings(settings), family_key, scenario, datasets,
                           view.master_seed, log=log, blocks=blocks)
        compilations = fitter.compilations
    write_batch(path, labels)
    return BatchResult(path, False, labels, len(datasets), design.rows, round(time.perf_counter() - t, 1),
                       compilations, record)


@dataclass(frozen=True)
class PowerSummaryResult:
    """The power gate's targets table and its decision (the section is written beside the record)."""

    table: pd.DataFrame
    decision: dict
    demo: bool
    path: Path
    #: Simulated datasets per sampler (the nutpie loop, the accelerator path's algorithm).
    samplers: dict = dataclasses.field(default_factory=dict)


def power_summary(view: Registered, estimates: pd.DataFrame, power_dir: Path,
                  registration_dir: str | Path) -> PowerSummaryResult:
    """6.3: label frequencies per hypothesis, scenario and frame count with Monte Carlo SEs,
    every registered target, the frame count, the hypotheses declared estimation-only and the
    traced source of a joint shortfall, from every finished batch; written to the registration
    record's power section. The embedded family's figures are a reduced demo at its own frame
    count, NOT the registered simulation."""
    settings, family_key = view.settings, view.family.key
    directory = power_dir / family_key / run_key(settings, family_key, estimates)
    labels = read_batches(directory)
    t = PowerTargets.from_settings(settings)
    reduced = view.power_reduction
    demo = reduced is not None
    if demo:  # a reduced simulation (the demo's, a rehearsal's) runs at its own frame count only
        frames = reduced.frames
        t = PowerTargets(**{**t.__dict__, "frames_start": frames, "frames_max": frames})
    if labels.empty:
        raise ValueError(f"no finished power batches under {directory}: materialise power_simulation for "
                         f"family {family_key} first (a backfill over its batch partitions)")
    decision = decide(labels, t, NOT_SIMULATED)
    samplers = datasets_per_sampler(labels)
    from_targets = label_frequencies_records(labels)
    expected = len(batch_keys_of(settings, family_key))
    what = "REHEARSAL" if view.rehearsal else "DEMO"
    section = {"demo": demo, "note": (f"REDUCED {what} SIMULATION, NOT the registered simulation: "
                                      f"{reduced.as_written()}") if demo else "",
               "datasets_fitted": int(labels.groupby(["scenario", "frames"])["dataset"].nunique().sum()),
               "fits_missing_convergence_rule": int((~labels["converged"].astype(bool)).sum()),
               "frame_parametrisation": frame_forms_record(view.frame_parametrisation, labels),
               "samplers": samplers,
               "fits": int(len(labels)),
               "batches_found": int(len(list(directory.glob('*.parquet')))), "batches_registered": expected,
               **{k: v for k, v in decision.items() if k != "targets"},
               "targets": decision["targets"],
               "label_frequencies": from_targets}
    path = write_power_section(registration_dir, family_key, section)
    table = pd.DataFrame(decision["targets"]).assign(family=family_key, demo=demo, power_json=str(path))
    return PowerSummaryResult(table, decision, demo, path, samplers)


def datasets_per_sampler(labels: pd.DataFrame) -> dict[str, int]:
    """The record's count of simulated datasets per sampler (the nutpie loop, or the
    accelerator path under its algorithm); rows stored before the ``sampler`` column were the
    nutpie loop's. Pure."""
    if labels.empty:
        return {}
    sampler = labels["sampler"] if "sampler" in labels else pd.Series(None, index=labels.index, dtype=object)
    keyed = labels.assign(sampler=sampler.fillna(NUTPIE_LOOP))
    per = keyed.drop_duplicates(["scenario", "frames", "dataset", "sampler"])["sampler"].value_counts()
    return {str(k): int(v) for k, v in sorted(per.items())}


def label_frequencies_records(labels: pd.DataFrame) -> list[dict]:
    """The label frequencies as the power section stores them (one record per row)."""
    return label_frequencies(labels).to_dict(orient="records")


def required_rows(power_summary: pd.DataFrame) -> pd.DataFrame:
    """The targets 6.3's gate requires (``required``, ``simulation.targets.required_targets``:
    the decided frame count, less what 6.3's fixed rules excuse). A table without
    ``required`` (stored before it existed) requires every row."""
    if "required" not in power_summary:
        return power_summary
    return power_summary[power_summary["required"].astype("boolean").fillna(True).to_numpy(dtype=bool)]


def power_targets_passed(power_summary: pd.DataFrame) -> bool:
    """6.3's gate on a stored power summary: a frame count is decided (some target is
    required) and every required target is met."""
    return len(required_rows(power_summary)) > 0 and targets_missed(power_summary).empty


def targets_missed(power_summary: pd.DataFrame) -> pd.DataFrame:
    """6.3's gate: the required targets (:func:`required_rows`) not met; a target whose
    component is not simulated (``met`` None: not computable) counts as not met."""
    required = required_rows(power_summary)
    # As stored (a nullable boolean) a not-computable target is NA, and NA in a mask selects
    # nothing: read it as not met explicitly, or a summary of met and not-computable targets
    # would clear the gate.
    met = required["met"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    return required[~met]
