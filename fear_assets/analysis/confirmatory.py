"""The confirmatory analysis of one configuration (protocol 5, 6.1-6.2; D3-D5), as one
pure function of unmasked scores: H1-H3 (band-averaged contrasts of the primary model),
H5 (hierarchical probit at the H5 depth), gates (a)-(c), the positive controls, and the
secondary and sensitivity estimands. Each estimand is one row; one that its design did not
score says so (status ``not_scored`` / ``not_available``), never a made-up number.

Refits that keep the primary model's shape (recall, summed and first-person Delta, the
prior-sensitivity refit, service relevance, role-play, the base checkpoint, three of the
four controls) go through the compiled model with new data (``Fitter``), so they cost a
sampling run, not a compilation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis import gate_c as gc
from fear_assets.analysis import secondary
from fear_assets.analysis.controls import CONTROLS, control_verdict, fit_control
from fear_assets.analysis.gate_b import recall_rows
from fear_assets.models.data import AGENTS, kept, levels_of, model_table
from fear_assets.models.fits import Fit, contrast_summary, convergence_problems, fit_cells, remedied, remedy_draws
from fear_assets.models.h5_model import build_h5_model, cell_label, h5_contrast, prepare_h5
from fear_assets.models.primary_model import (
    Fitter,
    MissingBandDepthError,
    cell_means,
    convergence,
    divergences,
    hypotheses,
    posterior_draws,
    sample,
)


@dataclass
class Registered:
    """The registered numbers the analysis reads (all from the protocol settings)."""

    hdi_prob: float
    sesoi: float
    meaningful: float
    sensitivity_sd: float
    convergence: Mapping[str, float]
    flag_rate: float
    control_min_mean: float
    control_hdi_above: float
    draws: int
    tune: int
    chains: int
    #: settings ``fitting.convergence_remedy`` (None: the registered run only, no extension).
    convergence_remedy: object = None


@dataclass
class Inputs:
    scores: pd.DataFrame  # unmasked: agent, content, condition joined
    surprisal: pd.DataFrame
    fears_of: Mapping[str, str]
    fears: Sequence[str]
    neutral_option: int
    band: Sequence[str]
    h5_depth: str
    pilot_sigma: float
    depth_tokens: Mapping[str, int]
    prefix: str  # "" for confirmatory frames, "pilot_" when only the pilot frames were scored
    registered: Registered
    seed: Callable[[str], int]
    pilot_sigma_judge: float | None = None
    bank: object | None = None
    topic_counts_path: object | None = None
    pilot_controls: pd.DataFrame | None = None
    h5_priors: object | None = None
    gate_c_priors: object | None = None
    log: Callable[[str], None] = print
    # Gate (c): the judge's own document-independent sentence surprisal (its covariates).
    judge_surprisal: pd.DataFrame | None = None
    # 4.5: the generated reports' resolved outcomes (report_scoring's table); None: not scored.
    reports: pd.DataFrame | None = None
    # 4.3: the base checkpoint's own sentence surprisal and the registered matching tolerance.
    base_surprisal: pd.DataFrame | None = None
    matching_tolerance: float | None = None


@dataclass
class Result:
    rows: list[dict] = field(default_factory=list)
    draws: dict[str, np.ndarray] = field(default_factory=dict)
    by_depth: pd.DataFrame | None = None
    fits: dict[str, Fit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The convergence remedy's runs (fits.remedied): one row per run of every remedied fit.
    extensions: list[dict] = field(default_factory=list)
    exclusions: pd.DataFrame | None = None  # 4.8: per cell, trials, excluded and each reason's count
    # Every fit's InferenceData by fit name (primary, refits, gate c, H5, controls, paired fits), saved.
    inference: dict[str, object] = field(default_factory=dict)


def _missing(name: str, kind: str, status: str, note: str) -> dict:
    return {"contrast": name, "kind": kind, "status": status, "note": note, "mean": np.nan, "hdi_low": np.nan,
            "hdi_high": np.nan, "label": "", "practically_meaningful": False, "rhat": np.nan, "ess_bulk": np.nan,
            "ess_tail": np.nan, "divergences": 0}


def h2(mu) -> np.ndarray:
    return hypotheses(mu)["H2"]


def run(inputs: Inputs, fitter: Fitter) -> Result:
    reg, out = inputs.registered, Result()
    scores = inputs.scores
    block = lambda name: scores[scores["block"] == inputs.prefix + name]

    def table(name: str, outcome: str = "delta", surprisal: pd.DataFrame | None = None) -> pd.DataFrame:
        rows = block(name)
        own = inputs.surprisal if surprisal is None else surprisal
        return (model_table(rows, own, dict(inputs.fears_of), inputs.neutral_option, outcome)
                if len(rows) else rows)

    def summary(name: str, kind: str, draws: np.ndarray, fit, scale: str = "Delta", rope: float | None = None,
                note: str = "") -> dict:
        # ``fit``: anything with chains, diagnostics["divergences"] and rows (Fit, ControlFit).
        return contrast_summary(name, draws, fit.chains, reg.hdi_prob, reg.sesoi, rope,
                                fit.diagnostics["divergences"], kind=kind, status="estimated", scale=scale,
                                note=note, trials=fit.rows, frame_parametrisation=getattr(fit, "frames", None))

    def put(row: dict, draws: np.ndarray) -> dict:
        out.rows.append(row)
        out.draws[row["contrast"]] = np.asarray(draws)
        inputs.log(f"{row['contrast']}: mean {row['mean']:.3f}, {reg.hdi_prob:.0%} HDI [{row['hdi_low']:.3f}, "
                   f"{row['hdi_high']:.3f}] -> {row['label']}")
        return row

    def add(name: str, kind: str, draws: np.ndarray, fit, scale: str = "Delta", rope: float | None = None,
            note: str = "") -> dict:
        """A contrast of fits already made (no rerun of its own)."""
        row = summary(name, kind, draws, fit, scale, rope, note)
        row["convergence_problems"] = "; ".join(convergence_problems(row, reg.convergence))
        if getattr(fit, "idata", None) is not None:
            out.inference[name] = fit.idata
        return put(row, draws)

    def fit_remedied(name: str, fit_at, contrasts, draws: int | None = None):
        """``fit_at(fitter, draws)`` made and its ``contrasts(fit)`` ([(row, draws)]) reported under
        the registered convergence remedy (fits.remedied): rerun, the same seed, with more
        draws while a contrast misses the rule; the runs go to ``out.extensions``."""
        schedule = remedy_draws(fitter.draws if draws is None else draws, reg.convergence_remedy)
        result = remedied(name, lambda n: (lambda fit: (fit, contrasts(fit)))(fit_at(fitter.with_draws(n), n)),
                          schedule, reg.convergence)
        out.extensions += result.runs
        # The reported run's fit (a Fit or ControlFit carries its idata; H5's value is the idata).
        idata = getattr(result.value, "idata", result.value)
        if idata is not None and hasattr(idata, "posterior"):
            out.inference[name] = idata
        rows = [put(row, result.draws[row["contrast"]]) for row in result.rows]
        return result.value, rows

    # -- H1-H3 on Delta -------------------------------------------------------------------
    primary = table("primary")
    if primary.empty:
        raise ValueError(f"no {inputs.prefix}primary scores: materialise scores for every depth first")
    pfit, _ = fit_remedied(
        "primary", lambda f, _: fit_cells(f, primary, inputs.fears, inputs.band, inputs.seed("primary"), "primary"),
        lambda fit: [(summary(h, "confirmatory", x, fit), x) for h, x in hypotheses(fit.mu).items()])
    out.fits["primary"] = pfit
    out.by_depth = delta_by_depth(pfit, inputs)

    # -- same-shape refits: recall (gate b), summed, first-person, prior sensitivity -------
    def refit(name: str, data: pd.DataFrame, kind: str, note: str = "", fixed_sd: float | None = None,
              extra=lambda fit: []) -> dict:
        """H2 of a same-shape refit (and ``extra(fit)``'s further contrasts of the same fit)."""
        fit, rows = fit_remedied(
            name, lambda f, _: fit_cells(f, data, inputs.fears, inputs.band, inputs.seed(name), name, fixed_sd=fixed_sd),
            lambda fit: [(summary(name, kind, h2(fit.mu), fit, note=note), h2(fit.mu)), *extra(fit)])
        out.fits[name] = fit
        return rows[0]

    # Gate (b): rows without a recall Delta leave the fit and are counted; not scored only when
    # H2 cannot be formed (gate_b.recall_rows). A not-scored gate never passes (section8_reading).
    recall = recall_rows(primary, inputs.band)
    # 5: "the same estimands ... on the recall branch": H1 and H3 from the recall fit (its H2
    # is the gate (b) row), so the remedy reruns them with it.
    recall_extra = lambda fit: [(summary(f"{h}_recall", "secondary", hypotheses(fit.mu)[h], fit,  # noqa: E731
                                         note=f"{h} on the recall branch (same fit as gate b)"), hypotheses(fit.mu)[h])
                                for h in ("H1", "H3")]
    row = refit("gate_b_recall_H2", recall.data, "gate", recall.note, extra=recall_extra) if recall.scored else \
        _missing("gate_b_recall_H2", "gate", "not_scored", recall.note)
    if not recall.scored:
        out.rows.append(row)
    row["missing_rows"] = recall.missing
    refit("H2_summed_logprob", primary.assign(outcome=primary["delta_sum"]), "sensitivity",
          "summed rather than per-token log-probability Delta")
    first = primary["delta_first_person"].where(primary["agent"] == "self", primary["delta"])
    if first.notna().all():
        refit("H2_first_person", primary.assign(outcome=first), "sensitivity",
              "self cells scored with the first-person report form")
    refit("H2_prior_sensitivity", primary, "sensitivity",
          f"fixed effects Normal(0, {reg.sensitivity_sd:g}) instead of the registered prior", fixed_sd=reg.sensitivity_sd)

    # -- gate (a): service relevance; role-play; base checkpoint --------------------------

    data = table("service_relevance")
    if data.empty:
        out.rows.append(_missing("gate_a_service_relevance_H2", "gate", "not_scored",
                                 f"block {inputs.prefix}service_relevance not scored in this design"))
    else:
        refit("gate_a_service_relevance_H2", data, "gate", "H2 in the service-relevance condition (gate a)")
    role_play = table("role_play")
    if role_play.empty:
        for name in ("H2_role_play", "H2_role_play_minus_default"):
            out.rows.append(_missing(name, "secondary", "not_scored", f"block {inputs.prefix}role_play not scored in "
                                     "this design"))
    else:
        refit("H2_role_play", role_play, "secondary", "H2 with the role-play prompt")
        # 4.8: the difference in H2 between role-play and default prompts, paired by frame (one joint fit).
        paired = secondary.paired_h2_difference(fitter, "role_play", role_play, primary, inputs.fears, inputs.band,
                                                inputs.seed("H2_role_play_minus_default"), per_block_sigma=False)
        add("H2_role_play_minus_default", "secondary", paired.draws, paired,
            note="role-play minus default H2, one joint fit with the matched default cells (frame effects shared)")
    base_checkpoint(inputs, fitter, block, table, refit, add, primary, out)

    # -- gate (c): the joint model of the tested model and the foreign judge -------------
    judge = table("judge", surprisal=inputs.judge_surprisal) if inputs.judge_surprisal is not None else block("judge")
    if judge.empty:
        out.rows.append(_missing("gate_c_judge_H2_difference", "gate", "not_scored",
                                 f"block {inputs.prefix}judge not scored in this design"))
    else:
        gate_c(inputs, primary, judge, out, fit_remedied)

    # -- H5: hierarchical probit at the H5 depth -------------------------------------------
    h5(inputs, block, out, fit_remedied)

    # -- positive controls -------------------------------------------------------------------
    controls(inputs, table, out, summary, fit_remedied)

    # -- secondary and sensitivity estimands that are not refits ----------------------------
    bayes = {r["contrast"]: r["label"] for r in out.rows if r["contrast"] in ("H1", "H2", "H3")}
    out.rows += secondary.frequentist_rows(primary, inputs.fears, inputs.band, reg.hdi_prob, reg.sesoi, bayes)
    out.rows += secondary.mediation_rows(primary, inputs.fears, inputs.band, reg.hdi_prob)
    exclusion, rates = secondary.exclusion_rows(scores[scores["block_kind"] != "baseline"], reg.flag_rate)
    out.rows += exclusion
    out.exclusions = rates
    flagged = rates[rates["flagged"] & (rates["block"] == inputs.prefix + "primary")]
    if len(flagged):
        keep = ~primary.set_index(["agent", "content", "depth"]).index.isin(
            list(flagged[["agent", "content", "depth"]].itertuples(index=False, name=None)))
        try:
            refit("H2_without_flagged_cells", primary[keep], "sensitivity",
                  f"cells with more than {reg.flag_rate:.0%} exclusions left out")
        except MissingBandDepthError as exc:
            # Every cell of a band depth flagged: the band average does not exist without them.
            out.rows.append(_missing("H2_without_flagged_cells", "sensitivity", "not_available", str(exc)))
    if inputs.bank is not None:
        phrases = {fear: sorted({f.verb("assistant", "threat") for s in ("pilot", "confirmatory", "reserve")
                                 for f in inputs.bank.frames_of(fear, s)}) for fear in inputs.fears}
        out.rows += secondary.five_fear_rows(primary, inputs.fears, inputs.topic_counts_path, phrases)
    out.rows += secondary.generated_report_rows(primary, inputs.reports)  # 4.5's resolved outcome
    # 4.8: excluded trials enter no estimand (the class means and the protective choice included).
    out.rows += secondary.class_rows(kept(scores), inputs.prefix, reg.hdi_prob, reg.sesoi)
    return out


def base_checkpoint(inputs: Inputs, fitter: Fitter, block, table, refit, add, primary: pd.DataFrame,
                    out: Result) -> None:
    """5's base checkpoint rows: H2 under the base checkpoint (its own fit, every frame, the
    base checkpoint's own surprisal covariates), and the base-against-assistant difference
    in H2, one joint fit of the two checkpoints' trials on the frames that pass matching
    under both (4.3), each block with its own checkpoint's covariates and residual scale."""

    names = ("H2_base_checkpoint", "H2_base_vs_assistant")
    if block("base_checkpoint").empty:
        for name in names:
            out.rows.append(_missing(name, "secondary", "not_scored",
                                     f"block {inputs.prefix}base_checkpoint not scored in this design"))
        return
    if inputs.base_surprisal is None or inputs.matching_tolerance is None:
        for name in names:
            out.rows.append(_missing(name, "secondary", "not_available",
                                     "the base checkpoint's own sentence surprisal is not available (materialise "
                                     "base_sentence_surprisal): its covariates and matching cannot be the tested "
                                     "checkpoint's"))
        return
    base = table("base_checkpoint", surprisal=inputs.base_surprisal)
    refit("H2_base_checkpoint", base, "secondary", "H2 under the base checkpoint (its own surprisal covariates)")
    both, default = secondary.base_comparison_rows(base, primary, inputs.surprisal, inputs.base_surprisal,
                                                   inputs.matching_tolerance)
    if both.empty:
        out.rows.append(_missing("H2_base_vs_assistant", "secondary", "not_available",
                                 "no analysed frame passes matching under both checkpoints (4.3)"))
        return
    paired = secondary.paired_h2_difference(fitter, "base", both, default, inputs.fears, inputs.band,
                                            inputs.seed("H2_base_vs_assistant"), per_block_sigma=True)
    n_frames = both["frame"].nunique()
    add("H2_base_vs_assistant", "secondary", paired.draws, paired,
        note=f"base minus assistant H2, one joint fit on the {n_frames} of {base['frame'].nunique()} frame(s) passing "
             "matching under both checkpoints (4.3), each checkpoint with its own covariates and residual scale")


def delta_by_depth(fit: Fit, inputs: Inputs) -> pd.DataFrame:
    """Posterior cell means at each depth (for the Delta-by-depth plot)."""
    import arviz as az


    rows = []
    for depth in fit.data.levels["depth"]:
        mu = cell_means(fit.data, posterior_draws(fit.idata, "beta"), posterior_draws(fit.idata, "intercept"), [depth])
        for (agent, content), draws in mu.items():
            low, high = az.hdi(draws, hdi_prob=inputs.registered.hdi_prob)
            rows.append({"agent": agent, "content": content, "depth": depth,
                         "depth_tokens": inputs.depth_tokens.get(depth, 0), "mean": float(draws.mean()),
                         "low": float(low), "high": float(high)})
    return pd.DataFrame(rows)


def gate_c(inputs: Inputs, primary: pd.DataFrame, judge: pd.DataFrame, out: Result, fit_remedied) -> None:
    """Gate (c): standardised H2 of the tested model minus the judge's, in one joint model;
    labelled with ROPE 0.15/sigma and meaningful size 0.30/sigma (sigma from the pilot)."""

    reg = inputs.registered
    tested_sigma = inputs.pilot_sigma
    # Each reader's covariates are its own surprisals (centred on its own bank means).
    if inputs.judge_surprisal is None:
        out.rows.append(_missing("gate_c_judge_H2_difference", "gate", "not_available",
                                 "the judge's own sentence surprisal is not available (materialise "
                                 "judge_sentence_surprisal): its covariates cannot be the tested model's"))
        return
    # Each reader's own pilot residual SD standardises its Delta (4.8, 6.2).
    if not np.isfinite(tested_sigma):
        out.rows.append(_missing("gate_c_judge_H2_difference", "gate", "not_available",
                                 "the tested model's pilot residual SD is not finite (nu <= 2 in the pilot fit; the "
                                 "registration record's gate_c_scale gate): no scale to standardise by"))
        return
    if inputs.pilot_sigma_judge is None or not np.isfinite(inputs.pilot_sigma_judge):
        out.rows.append(_missing("gate_c_judge_H2_difference", "gate", "not_available",
                                 "the judge's pilot residual SD is not in the registration record (score pilot_judge)"))
        return
    data = pd.concat([primary.assign(reader="tested"), judge.assign(reader="judge")], ignore_index=True)
    levels = levels_of(data, inputs.fears)
    sigmas = {"tested": tested_sigma, "judge": float(inputs.pilot_sigma_judge)}
    d = gc.prepare_gate_c(data, levels, sigmas, inputs.gate_c_priors.reader_factor_sd, outcome="outcome")

    rope, meaningful = gc.gate_c_bounds(tested_sigma, reg.sesoi, reg.meaningful)

    def fit_at(_, draws: int) -> Fit:
        idata = sample(gc.build_gate_c_model(d, inputs.gate_c_priors), draws, reg.tune, reg.chains,
                       inputs.seed("gate_c"))
        return Fit("gate_c", d, idata, {}, list(inputs.band), len(data),
                   convergence(idata, ("intercept", "beta", "block_beta", "sigma", "nu")))

    def contrasts(fit: Fit) -> list:
        draws = gc.gate_c_contrast(fit.idata, d, list(inputs.band))
        row = contrast_summary("gate_c_judge_H2_difference", draws, fit.chains, reg.hdi_prob, reg.sesoi, rope,
                               fit.diagnostics["divergences"], kind="gate", status="estimated", scale="standardised",
                               trials=fit.rows,
                               note=f"ROPE +-{rope:.3f} on the standardised scale ({reg.sesoi:g}/sigma; meaningful "
                                    f"size {meaningful:.3f} = {reg.meaningful:g}/sigma; pilot sigma {tested_sigma:.4f}); "
                                    f"practically meaningful = HDI wholly beyond the ROPE")
        decision = gc.gate_c_decision(row["hdi_low"], row["hdi_high"], tested_sigma, reg.sesoi, reg.meaningful)
        row["label"], row["practically_meaningful"] = decision.label, decision.practically_meaningful
        return [(row, draws)]

    fit_remedied("gate_c", fit_at, contrasts, reg.draws)


def h5(inputs: Inputs, block, out: Result, fit_remedied) -> None:
    """H5: d'(self, T) - d'(self, H) at the registered H5 depth; content-removed trials
    inform only the criterion."""

    reg = inputs.registered
    fc = kept(block("primary"))  # 4.8: excluded trials enter no estimand
    fc = fc[(fc["depth"] == inputs.h5_depth) & fc["fc_choice"].astype(int).isin([1, 2])]
    removed = kept(block("content_removed"))
    removed = removed[(removed["depth"] == inputs.h5_depth) & removed["fc_choice"].astype(int).isin([1, 2])]
    if fc.empty:
        out.rows.append(_missing("H5", "confirmatory", "not_scored", f"no forced choices at the H5 depth {inputs.h5_depth}"))
        return
    rows = pd.concat([fc.assign(shown_option=fc["content_option"].astype(int)),
                      removed.assign(shown_option=0)], ignore_index=True)
    rows = rows.assign(chose_option1=rows["fc_choice"].astype(int) == 1,
                       option1_first=rows["fc_first_listed"].astype(int) == 1, frame=rows["item_id"])
    cells = [(a, c) for a in AGENTS for c in ("threat", "harmless")]
    d = prepare_h5(rows, cells)
    if inputs.h5_priors is None:
        raise ValueError("H5 needs its registered priors (H5Priors.from_settings)")
    def contrasts(idata) -> list:
        draws = h5_contrast(idata, cells)
        out_rows = [(contrast_summary("H5", draws, reg.chains, reg.hdi_prob, reg.sesoi, divergences=divergences(idata),
                                      kind="confirmatory", status="estimated", scale="d'", trials=len(rows),
                                      note=f"forced choices at {inputs.h5_depth} ({len(removed)} content-removed "
                                           "trials inform the criterion only)"), draws)]
        # 5, secondary: plain d' for the self-threat cell and the agent x content interaction on
        # d' (its two agent contrasts, the H2 and H3 forms), from the same probit fit.
        out_rows += [(contrast_summary(name, sec, reg.chains, reg.hdi_prob, reg.sesoi, divergences=divergences(idata),
                                       kind="secondary", status="estimated", scale="d'", trials=len(rows),
                                       note=f"from the H5 probit at {inputs.h5_depth}"), sec)
                     for name, sec in dprime_secondaries(idata, cells).items()]
        return out_rows

    fit_remedied("h5", lambda _, n: sample(build_h5_model(d, inputs.h5_priors), n, reg.tune, reg.chains,
                                           inputs.seed("h5")), contrasts, reg.draws)


def dprime_secondaries(idata, cells) -> dict[str, np.ndarray]:
    """5: d'(self, threat) and the agent x content interaction on d', as draws: the H2 form
    (self vs peer) and the H3 form (self vs person) of [d'(a, T) - d'(a, H)] differences."""

    dp = idata.posterior["dprime"]
    cell = lambda a, c: dp.sel(cell=cell_label((a, c))).values.reshape(-1)  # noqa: E731
    effect = {a: cell(a, "threat") - cell(a, "harmless") for a in AGENTS}
    return {"dprime_self_threat": cell("self", "threat"),
            "dprime_interaction_self_vs_peer": effect["self"] - effect["peer"],
            "dprime_interaction_self_vs_person": effect["self"] - effect["person"]}


def controls(inputs: Inputs, table, out: Result, summary, fit_remedied) -> None:
    """Positive-control contrasts (D4) with their pass rule, each from one fit over the control
    cells and the matched primary cells (``controls.fit_control``). On pilot frames the pilot's
    own control fits are reused (the same data; Appendix C runs them once)."""
    reg = inputs.registered
    pfit_table = table("primary")
    if inputs.prefix == "pilot_" and inputs.pilot_controls is not None:
        for r in inputs.pilot_controls.itertuples():
            scored = not str(r.reason).startswith("not scored")
            row = _missing(f"control_{r.control}", "control", "estimated" if scored else "not_scored",
                           f"the pilot's control fit ({r.reason})")
            row.update({"mean": r.mean, "hdi_low": r.hdi_low, "hdi_high": r.hdi_high,
                        "label": "passes" if r.passed else "fails", "control_passed": bool(r.passed)})
            out.rows.append(row)
        return
    for name, suffix in CONTROLS.items():
        data = table(suffix)
        if data.empty:
            row = _missing(f"control_{name}", "control", "not_scored", f"block {inputs.prefix}{suffix} not scored")
            row["control_passed"] = False
            out.rows.append(row)
            continue
        def contrasts(fit, name=name) -> list:
            verdict = control_verdict(name, fit.draws, reg.hdi_prob, reg.control_min_mean, reg.control_hdi_above)
            row = summary(f"control_{name}", "control", fit.draws, fit, note=verdict.reason + "; one fit with the "
                          "matched primary cells" if name != "addressee_name" else verdict.reason + "; its own cells")
            row["control_passed"] = verdict.passed
            return [(row, fit.draws)]

        fit_remedied(f"control_{name}", lambda f, _, name=name, data=data: fit_control(
            f, name, data, pfit_table, inputs.fears, inputs.band, inputs.seed(name)), contrasts)
