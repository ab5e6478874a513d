"""The analysis stage's steps (protocol 6.1-6.2; D3-D4): H4 on the probe log-odds and every
registered estimand of one configuration, each ``(stored inputs, registered view) -> result``
with the table and the facts its step shows. The depth band, H5 depth and pilot sigma come
from the registration record, never from the analysed data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from fear_assets.analysis.confirmatory import Inputs, Registered as AnalysisRegistered, Result, run
from fear_assets.analysis.estimands import apply_estimation_only, convergence_split, estimand_flags, h4_estimand_row
from fear_assets.analysis.gate_c import GateCPriors
from fear_assets.analysis.h4 import fit_h4, h4_data, h4_declared, h4_flags, h4_label
from fear_assets.analysis.plots import delta_by_depth_plot, forest_plot
from fear_assets.analysis.unmasking import unmask
from fear_assets.core.hashing import sha256_file, write_inference_data
from fear_assets.core.registered import Registered
from fear_assets.core.settings import DepthBand, ProtocolSettings, depth_key
from fear_assets.models.data import PILOT_FALLBACK_NOTE, analysed_rows
from fear_assets.models.h5_model import H5Priors
from fear_assets.models.primary_model import Fitter, Priors
from fear_assets.pilot.surprisal import require_same_names
from fear_assets.registration.gates import declared_estimation_only


def stored_record(registration_record: pd.DataFrame) -> dict:
    """The registration record as the ``registration_record`` asset stored it (its JSON)."""
    return json.loads(registration_record["record_json"].iloc[0])


def analysis_registered(view: Registered) -> AnalysisRegistered:
    """The registered numbers the confirmatory analysis reads, from the family's view (the
    embedded family's convergence remedy is the view's: the demo's limit)."""
    d, s, pc = view.decision, view.sampler, view.positive_controls
    return AnalysisRegistered(hdi_prob=d.hdi_prob, sesoi=d.sesoi, meaningful=d.meaningful,
                              sensitivity_sd=view.priors.sensitivity_fixed_effect_sd,
                              convergence=view.convergence, flag_rate=view.exclusion.cell_flag_rate,
                              control_min_mean=pc.pass_min_mean, control_hdi_above=pc.hdi_above,
                              draws=s.draws, tune=s.tune, chains=s.chains,
                              convergence_remedy=view.convergence_remedy)


def analysis_fitter(view: Registered) -> Fitter:
    """The registered model under the registered priors and sampler (6.1), its frame effects
    sampled as the registered rule picks per fit (D3b)."""
    s = view.sampler
    return Fitter(Priors.from_settings(view.settings), s.draws, s.tune, s.chains, rule=view.frame_parametrisation)


@dataclass(frozen=True)
class H4Result:
    """H4's row and the facts its step shows."""

    table: pd.DataFrame
    frame_set: str
    mean: float
    hdi_low: float
    hdi_high: float
    label: str


def h4_posterior(view: Registered, bank, probe_outputs: pd.DataFrame, probe_controls: pd.DataFrame,
                 pilot_probe_outputs: pd.DataFrame, pilot_probe_controls: pd.DataFrame,
                 registration_record: pd.DataFrame, sentence_surprisal: pd.DataFrame,
                 confirmatory_scores: pd.DataFrame, pilot_scores: pd.DataFrame, assignment_key: pd.DataFrame,
                 frozen: dict, directory: Path) -> H4Result:
    """H4, carriage (6.1): the primary model on probe log-odds averaged over the record's band
    depths, 99% HDI and the decision rule, fitted on masked codes and unmasked only once
    scoring is locked (``frozen``: the frozen-inputs record). Where the design probes no
    confirmatory frame the pilot's probe is read (descriptive). The draws go to
    ``directory/h4_<frame set>.nc``; the flags say whether H4 is uninterpretable (controls)
    or estimation-only (ceiling)."""
    settings, family = view.settings, view.family
    family_key = family.key
    scores, frame_set = analysed_rows(confirmatory_scores, pilot_scores)
    outputs, controls = (probe_outputs, probe_controls) if frame_set == "confirmatory" else \
        (pilot_probe_outputs, pilot_probe_controls)
    outputs = unmask(outputs, assignment_key, list(family.depth_keys), scores, frozen)
    record = stored_record(registration_record)
    band = DepthBand.of(record["depth_band"])
    data = h4_data(outputs, sentence_surprisal, {i: bank.item(i).group for i in outputs["item_id"].unique()},
                   settings.neutral_partner_option)
    s = view.sampler
    fit = fit_h4(data, settings.fears, list(band.indices), Priors.from_settings(settings), s.draws, s.tune, s.chains,
                 view.seed("h4", family_key, frame_set), view.decision.hdi_prob, view.decision.sesoi)
    path = directory / f"h4_{frame_set}.nc"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_inference_data(fit.idata, path)
    if fit.draws is not None:
        np.savez(h4_contrast_path(path), H4=np.asarray(fit.draws))
    # 6.1's rules are flags on H4's row: the ceiling comes from the record (declared before
    # collection), the control probes from the analysed frame set and the pilot.
    interpretable, estimation_only = h4_declared(controls[controls["frame_set"] == frame_set], record)
    flags = h4_flags(fit.diagnostics, view.convergence, interpretable, estimation_only,
                     frame_set, data["frame"].nunique())
    reported = h4_label(fit.label, interpretable, estimation_only)
    table = pd.DataFrame([{
        "family": family_key, "frame_set": frame_set, "hypothesis": "H4", "mean": fit.mean, "hdi_low": fit.hdi_low,
        "hdi_high": fit.hdi_high, "label": reported,
        "practically_meaningful": fit.practically_meaningful and reported == fit.label,
        "band_depths": band.stored_keys, "documents": len(data), **fit.diagnostics,
        "flags": "; ".join(flags), "draws_file": str(path), "draws_sha256": sha256_file(path)}])
    return H4Result(table, frame_set, fit.mean, fit.hdi_low, fit.hdi_high, reported)


@dataclass(frozen=True)
class PosteriorsResult:
    """Every estimand's row and the facts the step shows (plots as PNG bytes, the fits' runs)."""

    table: pd.DataFrame
    frame_set: str
    pilot_only: bool
    flags: tuple[str, ...]
    directory: str
    draws_path: str
    forest_png: bytes
    depth_png: bytes
    compilations: int
    result: Result = field(repr=False)
    #: Every fit's InferenceData file (fit, file, sha256), also written as ``fits.csv``.
    fits_table: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)


def posteriors(view: Registered, bank, confirmatory_scores: pd.DataFrame, pilot_scores: pd.DataFrame,
               assignment_key: pd.DataFrame, sentence_surprisal: pd.DataFrame,
               judge_sentence_surprisal: pd.DataFrame, registration_record: pd.DataFrame,
               pilot_controls: pd.DataFrame, h4_posterior: pd.DataFrame, base_sentence_surprisal: pd.DataFrame,
               report_scoring: pd.DataFrame, frozen: dict, directory: Path, topic_counts_path: Path,
               log: Callable[[str], None] = print) -> PosteriorsResult:
    """Every registered estimand of one configuration (5, 6.1-6.2; D3, D4): H1-H3 as
    band-averaged contrasts of the primary model, H5 from the hierarchical probit at the H5
    depth, H4 from ``h4_posterior``, gates (a)-(c), the positive controls, and the secondary
    and sensitivity estimands, each with its 99% HDI, label and diagnostics. Fitted on masked
    data unmasked once scoring is locked; a hypothesis declared estimation-only keeps its
    interval, not its label (6.3). Draws, the primary fit and the plots go to ``directory``."""
    settings, family = view.settings, view.family
    family_key = family.key
    record = stored_record(registration_record)
    # The covariates must come from the names the documents carry (4.2, 4.3).
    require_same_names(sentence_surprisal, record["selected_names"], "posteriors")
    scores, frame_set = analysed_rows(confirmatory_scores, pilot_scores)
    unmasked = unmask(scores, assignment_key, list(family.depth_keys), scores, frozen)
    prefix = "" if frame_set == "confirmatory" else "pilot_"
    band = DepthBand.of(record["depth_band"]).keys
    fitter = analysis_fitter(view)
    inputs = Inputs(
        scores=unmasked, surprisal=sentence_surprisal, fears_of={i: bank.item(i).group for i in unmasked["item_id"].unique()},
        fears=settings.fears, neutral_option=settings.neutral_partner_option, band=band,
        h5_depth=depth_key(record["h5_depth"]), pilot_sigma=float("nan") if record["pilot_sigma"] is None else float(record["pilot_sigma"]),
        pilot_sigma_judge=record.get("pilot_sigma_judge"),
        depth_tokens={k: family.tokens_at(family.depth_index(k)) for k in family.depth_keys}, prefix=prefix,
        registered=analysis_registered(view),
        seed=lambda name: view.seed("posteriors", family_key, name),
        bank=bank, topic_counts_path=topic_counts_path,
        pilot_controls=pilot_controls, h5_priors=H5Priors.from_settings(settings),
        gate_c_priors=GateCPriors.from_settings(settings), log=log,
        judge_surprisal=judge_sentence_surprisal if len(judge_sentence_surprisal) else None,
        base_surprisal=base_sentence_surprisal if len(base_sentence_surprisal) else None,
        matching_tolerance=settings.matching.max_abs_difference, reports=report_scoring)
    result = run(inputs, fitter)
    table = pd.concat([pd.DataFrame(result.rows), pd.DataFrame([h4_estimand_row(h4_posterior.iloc[0])])],
                      ignore_index=True)
    # 6.3: a hypothesis declared estimation-only before collection keeps its interval, not its label.
    table = apply_estimation_only(table, declared_estimation_only(record))
    directory.mkdir(parents=True, exist_ok=True)
    draws_path, primary_path = directory / "contrasts.npz", directory / "primary.nc"
    np.savez(draws_path, **result.draws)
    write_inference_data(result.fits["primary"].idata, primary_path)
    fits = save_fits(result.inference, directory, primary_path, h4_posterior)
    flags = estimand_flags(record, frame_set == "pilot", family.stand_in, PILOT_FALLBACK_NOTE)
    table = table.assign(family=family_key, frame_set=frame_set, band_depths=",".join(band),
                         h5_depth=depth_key(record["h5_depth"]),
                         converged=table["convergence_problems"].fillna("") == "",
                         failed_gates="; ".join(flags), draws_file=str(draws_path),
                         draws_sha256=sha256_file(draws_path), primary_file=str(primary_path),
                         primary_sha256=sha256_file(primary_path))
    table["practically_meaningful"] = table["practically_meaningful"].fillna(False).astype(bool)
    forest_rows = table[table["kind"].isin(["confirmatory", "gate"]) & (table["status"] == "estimated")]
    forest = forest_plot(forest_rows.set_index("contrast")[["mean", "hdi_low", "hdi_high", "label", "converged"]].reset_index(),
                         view.decision.rope, view.decision.hdi_prob,
                         f"{family_key}: H1-H5 and gates (99% HDI, ROPE shaded)")
    depth_png = delta_by_depth_plot(result.by_depth)
    (directory / "forest.png").write_bytes(forest)
    (directory / "delta_by_depth.png").write_bytes(depth_png)
    return PosteriorsResult(table, frame_set, bool(prefix), tuple(flags), str(directory), str(draws_path),
                            forest, depth_png, fitter.compilations, result, fits)


def h4_contrast_path(fit_path: str | Path) -> Path:
    """Where H4's contrast draws lie beside its fit's InferenceData (``h4_<frame set>.nc``)."""
    fit_path = Path(fit_path)
    return fit_path.with_name(fit_path.stem + "_contrast.npz")


def contrast_draws(posteriors: pd.DataFrame) -> dict[str, np.ndarray]:
    """Every reported contrast's stored draws (chain-major): the estimands' ``contrasts.npz``
    and H4's own file beside its fit, where stored; empty where nothing is."""
    out: dict[str, np.ndarray] = {}
    if "draws_file" in posteriors.columns and len(posteriors):
        path = Path(str(posteriors["draws_file"].iloc[0]))
        if path.is_file():
            with np.load(path) as z:
                out.update({k: np.asarray(z[k]) for k in z.files})
        fits = path.parent / FITS_FILE
        if fits.is_file():
            for r in pd.read_csv(fits).itertuples():
                if str(r.fit).startswith("H4") and h4_contrast_path(r.file).is_file():
                    with np.load(h4_contrast_path(r.file)) as z:
                        out["H4"] = np.asarray(z["H4"])
    return out


FITS_FILE = "fits.csv"
FITS_COLUMNS = ["fit", "file", "sha256"]


def save_fits(inference: dict, directory: Path, primary_path: Path, h4_posterior: pd.DataFrame) -> pd.DataFrame:
    """Every fit's InferenceData as netCDF under ``directory`` (``fit_<name>.nc``; the primary
    fit is ``primary.nc`` and H4's is the ``h4_posterior`` file), with its sha256, listed in
    ``directory/fits.csv`` for the Stage 2 report."""
    rows = [{"fit": "primary", "file": str(primary_path), "sha256": sha256_file(primary_path)}]
    for name, idata in inference.items():
        if name == "primary":
            continue
        path = directory / f"fit_{name}.nc"
        write_inference_data(idata, path)
        rows.append({"fit": name, "file": str(path), "sha256": sha256_file(path)})
    for r in h4_posterior.to_dict("records"):
        if r.get("draws_file"):
            rows.append({"fit": f"H4 ({r.get('frame_set', '')})", "file": str(r["draws_file"]),
                         "sha256": str(r.get("draws_sha256", ""))})
    table = pd.DataFrame(rows, columns=FITS_COLUMNS)
    table.to_csv(directory / FITS_FILE, index=False)
    return table


def fits_frames(result: Result) -> dict[str, Any]:
    """The frame effects' form each fit sampled (the registered rule's pick, per fit)."""
    return {name: fit.frames for name, fit in result.fits.items() if getattr(fit, "frames", None)}


def h4_not_converged(h4_posterior: pd.DataFrame) -> pd.DataFrame:
    """H4's rows whose fit missed the convergence rule (6.1: a flag on its row, never a stop)."""
    return h4_posterior[h4_posterior["flags"].str.contains("NOT CONVERGED")]


def estimated_with_diagnostics(posteriors: pd.DataFrame) -> pd.DataFrame:
    """The estimated rows that carry diagnostics (the rows 6.1's convergence rule applies to)."""
    return posteriors[(posteriors["status"] == "estimated") & posteriors["rhat"].notna()]


NOT_CONVERGED_NEXT = ("What to change: more tuning and draws (settings: sampler), or more frames where frame effects "
                      "are not identified (one pilot frame cannot separate them from the intercept); never read a "
                      "label that did not converge.")


@dataclass(frozen=True)
class ConvergenceVerdict:
    """6.1's convergence check on the estimands: passed, whether a miss can stop the reading
    (an error, else a warning), what to say, and the rows examined."""

    passed: bool
    blocking: bool
    description: str
    estimated: pd.DataFrame


def convergence_verdict(posteriors: pd.DataFrame) -> ConvergenceVerdict:
    """Every reported contrast against 6.1's rule: a miss on H1-H3, H5, the gates or the controls
    blocks (its label must not be read); H4 (6.2: it never changes the reading) and a secondary
    or sensitivity contrast that misses it are a warning and a flag."""
    estimated = estimated_with_diagnostics(posteriors)
    blocking, flagged = convergence_split(estimated)
    listed = lambda bad: " | ".join(f"{r.contrast}: {r.convergence_problems}" for r in bad.itertuples())
    parts = []
    if len(blocking):
        parts.append("not converged (H1-H3, H5, gates, controls): " + listed(blocking) + ". " + NOT_CONVERGED_NEXT)
    if len(flagged):
        parts.append("H4/secondary/sensitivity not converged (flagged, cannot change the reading): " + listed(flagged))
    return ConvergenceVerdict(not parts, bool(len(blocking)),
                              "every reported contrast converged" if not parts else " ".join(parts), estimated)


def convergence_description(settings: ProtocolSettings) -> str:
    """6.1's convergence rule in words, from the registered ``convergence`` section (so a
    check's description never restates a registered number)."""
    c = settings.convergence
    return (f"R-hat <= {c.rhat_max}, bulk and tail ESS >= {c.ess_bulk_min}"
            + ("" if c.ess_tail_min == c.ess_bulk_min else f" (tail >= {c.ess_tail_min})")
            + (", no divergences" if c.divergences_max == 0 else f", at most {c.divergences_max} divergences"))
