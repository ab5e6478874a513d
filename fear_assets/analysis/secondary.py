"""Secondary and sensitivity estimands that are not refits of the registered model
(protocol 5, 6.2, 4.8): the frequentist mixed model and its disagreements with the
Bayesian labels, mediation by attention mass, H2 with and without the surprisal
covariates, per-cell exclusion rates, the five-fear breakdown with the topic-frequency
covariate, the generated-report estimand, the secondary classes and the protective choice.
Descriptive rows say so in their ``status``; none of them can change the reading.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.controls import ControlFit, matched_primary
from fear_assets.analysis.estimands import DISAGREES_NOTE
from fear_assets.analysis.frequentist import label_disagreements, mixed_model_contrasts
from fear_assets.analysis.mediation import NotEstimable, attention_mediation, h2_with_without_covariates
from fear_assets.analysis.topic_frequency import load_topic_counts
from fear_assets.core.numbers import yes_no
from fear_assets.models.data import AGENTS, levels_of
from fear_assets.models.decision import label
from fear_assets.models.exclusions import exclusion_rates
from fear_assets.models.joint import block_hypotheses, prepare_joint
from fear_assets.models.primary_model import convergence
from fear_assets.pilot.matching import frame_differences, frame_verdicts
from fear_assets.pilot.report_scoring import CATEGORIES, SIDES


def _row(name: str, status: str, note: str, **numbers) -> dict:
    base = {"contrast": name, "kind": "secondary", "status": status, "note": note, "mean": np.nan,
            "hdi_low": np.nan, "hdi_high": np.nan, "label": "", "practically_meaningful": False}
    base.update(numbers)
    return base


def frames_passing_both(tested: pd.DataFrame, base: pd.DataFrame, tolerance: float) -> set[str]:
    """4.3: "the base-against-assistant comparison uses only frames that pass under both
    checkpoints of the primary lineage": the frames whose every registered non-name
    surprisal difference lies within ``tolerance`` (the registered matching rule,
    ``pilot.matching``) under the tested checkpoint's sentence surprisal and under the base
    checkpoint's."""

    def passing(surprisal: pd.DataFrame) -> set[str]:
        v = frame_verdicts(frame_differences(surprisal), tolerance)
        return set(v.loc[v["passes"].astype(bool), "item_id"])

    return passing(tested) & passing(base)


def base_comparison_rows(base: pd.DataFrame, primary: pd.DataFrame, tested_surprisal: pd.DataFrame,
                         base_surprisal: pd.DataFrame, tolerance: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two blocks of the base-against-assistant comparison: the base checkpoint's and the
    assistant's (primary) model tables, each with its own checkpoint's covariates as given,
    kept to the frames that pass matching under both checkpoints (:func:`frames_passing_both`)."""
    frames = frames_passing_both(tested_surprisal, base_surprisal, tolerance)
    return base[base["frame"].isin(frames)], primary[primary["frame"].isin(frames)]


def paired_h2_difference(fitter, condition: str, block: pd.DataFrame, primary: pd.DataFrame, fears: Sequence[str],
                         band: Sequence[str], seed: int, per_block_sigma: bool):
    """H2 in ``block`` minus H2 in the matched default (primary) cells, from ONE joint fit
    (``analysis.joint``, a two-level condition factor), the paired form the positive controls
    use: the same frame's effects enter both blocks, so frame-to-frame variation common to
    both cancels in the difference instead of adding to it, as it does when two independent
    posteriors are subtracted. ``block`` and ``primary`` are model tables, each with its own
    reader's covariates; ``per_block_sigma``: each block its own residual scale (a different
    checkpoint reads the documents), else one shared (the same model under another prompt).
    Returns a ``controls.ControlFit`` (draws, rows, chains, diagnostics)."""

    if block.empty:
        raise ValueError(f"{condition}: no rows to fit; score its block first")
    matched = matched_primary(block, primary)
    if matched.empty:
        raise ValueError(f"{condition}: no default-prompt trial on its frames and depths; score the primary block there")
    data = pd.concat([block.assign(condition=condition), matched.assign(condition="default")], ignore_index=True)
    levels = levels_of(data, fears, AGENTS)
    d = prepare_joint(data, levels, "condition", (condition, "default"), fitter.priors.fixed_sd,
                      per_block_sigma=per_block_sigma)
    idata = fitter.fit(d, seed)
    h = block_hypotheses(idata, d, band)
    draws = h[condition]["H2"] - h["default"]["H2"]
    return ControlFit(condition, draws, len(data), int(idata.posterior.sizes["chain"]),
                      convergence(idata, ("intercept", "beta", "block_beta", "sigma", "nu")), idata)


def frequentist_rows(primary: pd.DataFrame, fears: Sequence[str], band: Sequence[str], level: float, sesoi: float,
                     bayes_labels: Mapping[str, str]) -> list[dict]:
    """The statsmodels mixed model's H1-H3, labelled by the same rule; disagreements with
    the Bayesian labels are reported, never applied (6.2)."""
    levels = levels_of(primary, fears)
    data = primary.assign(delta=primary["outcome"])
    try:
        freq = mixed_model_contrasts(data, levels, list(band), level)
    except Exception as exc:  # noqa: BLE001 - e.g. one pilot frame: reported as a row, never hidden
        return [_row("frequentist_mixed_model", "failed",
                     f"the mixed model could not be fitted ({type(exc).__name__}: {exc})", kind="sensitivity")]
    labelled = freq.merge(label_disagreements(bayes_labels, freq, sesoi), on="hypothesis")
    out = []
    for r in labelled.to_dict("records"):
        out.append(_row(f"frequentist_{r['hypothesis']}", "estimated",
                        f"linear mixed model ({freq.attrs.get('random_effects', '')}), {level:.0%} Wald interval; "
                        f"converged: {yes_no(freq.attrs.get('converged'))}; Bayesian label {r['bayesian_label']}"
                        + (f"; {DISAGREES_NOTE}" if r["disagree"] else ""),
                        mean=r["estimate"], hdi_low=r["ci_low"], hdi_high=r["ci_high"],
                        label=r["frequentist_label"], kind="sensitivity"))
    return out


def mediation_rows(primary: pd.DataFrame, fears: Sequence[str], band: Sequence[str], level: float) -> list[dict]:
    """5: mediation of H2 by attention mass and H2 with minus without the surprisal
    covariates, each with its frame-clustered ``level`` interval (``mediation``). Each row
    says its status: ``descriptive`` (estimated with its interval), ``not_available`` (no
    attention mass recorded) or ``not_estimable`` (the design cannot give the interval, e.g.
    a single frame), never a number without interval and never a hidden failure."""

    levels = levels_of(primary, fears)
    data = primary.assign(delta=primary["outcome"])
    present = list(band)  # a missing band depth is an error (check_band), not a smaller band
    out = []
    try:
        med = attention_mediation(data, levels, present, level)
    except NotEstimable as exc:
        out.append(_row("H2_mediation_attention", "not_estimable", f"not estimated: {exc}"))
    else:
        if not med["attention_recorded"]:
            out.append(_row("H2_mediation_attention", "not_available", med["note"]))
        else:
            ci = med["indirect_interval"]
            out.append(_row("H2_mediation_attention", "descriptive",
                            f"indirect effect (total minus direct) with its {level:.0%} frame-clustered interval; "
                            f"OLS with frame-clustered SEs; total {med['total']['estimate']:.3f}, direct "
                            f"{med['direct']['estimate']:.3f}, proportion mediated {med['proportion_mediated']:.3f}. "
                            f"{med['note']}", mean=float(med["indirect"]), hdi_low=ci["ci_low"],
                            hdi_high=ci["ci_high"]))
    try:
        cov = h2_with_without_covariates(data, levels, present, level)
    except NotEstimable as exc:
        out.append(_row("H2_without_surprisal_covariates", "not_estimable", f"not estimated: {exc}"))
    else:
        ci = cov["difference_interval"]
        out.append(_row("H2_without_surprisal_covariates", "descriptive",
                        f"OLS: H2 with the covariates {cov['with_covariates']['estimate']:.3f}, without "
                        f"{cov['without_covariates']['estimate']:.3f} (mean = with minus without, its {level:.0%} "
                        f"frame-clustered interval). {cov['note']}", mean=float(cov["difference"]),
                        hdi_low=ci["ci_low"], hdi_high=ci["ci_high"]))
    return out


def exclusion_rows(scores: pd.DataFrame, flag_rate: float) -> tuple[list[dict], pd.DataFrame]:
    """4.8: per design cell (block x agent x content x depth) exclusion rates; a cell above
    the registered rate is flagged (its sensitivity analysis is then reported)."""
    rates = exclusion_rates(scores, flag_rate=flag_rate)
    flagged = rates[rates["flagged"]]
    counts = (f"{int(rates['excluded'].sum())} of {int(rates['trials'].sum())} trials excluded "
              f"({int(rates['excluded_context'].sum())} document over the context window, "
              f"{int(rates['generation_truncated'].sum())} generated answer truncated); ")
    note = counts + ("no cell above the registered exclusion rate" if flagged.empty else
                     "flagged cells: " + "; ".join(f"{r.block}/{r.agent}/{r.content}/{r.depth} {r.rate:.1%}"
                                                  for r in flagged.itertuples()))
    return [_row("exclusions", "descriptive", note, mean=float(rates["rate"].max()) if len(rates) else 0.0)], rates


def five_fear_rows(primary: pd.DataFrame, fears: Sequence[str], counts_path: Path,
                   phrases_by_fear: Mapping[str, Sequence[str]]) -> list[dict]:
    """H2 per fear from the raw cell means (descriptive), with the topic-frequency covariate
    when the user supplied the counts file; otherwise the output says the counts are absent."""
    phrases = sorted({p for ps in phrases_by_fear.values() for p in ps})
    counts, message = load_topic_counts(counts_path, phrases)
    out = []
    for fear in fears:
        part = primary[primary["fear"] == fear]
        if part.empty:
            continue
        m = part.groupby(["agent", "content"])["outcome"].mean()
        try:
            value = (m[("self", "threat")] - m[("self", "harmless")]) - (m[("peer", "threat")] - m[("peer", "harmless")])
        except KeyError:
            value = np.nan
        freq = ""
        if counts is not None:
            own = counts[counts["phrase"].isin(phrases_by_fear.get(fear, ()))]
            freq = f"; topic frequency (sum of exact-match counts) {int(own['count'].sum())}"
        out.append(_row(f"H2_fear_{fear}", "descriptive",
                        f"raw cell means, {part['frame'].nunique()} frame(s){freq}", mean=float(value)))
    out.append(_row("topic_frequency", "supplied" if counts is not None else "not_available", message))
    return out


def report_outcomes(answers: pd.DataFrame, reports: pd.DataFrame) -> pd.DataFrame:
    """Per answered trial, the resolved 4.5 outcome of each item: ``reports`` is
    ``report_scoring``'s table (one row per trial and side, ``category`` mention / no_mention /
    refusal: the keyword rule and the blinded scorer, the stem pass where they disagree).
    Returns ``answers``' trials that have both sides scored, with ``refusal`` (the answer is a
    refusal: its own category, no mention outcome) and ``difference`` = agent mention minus
    neutral mention (-1, 0 or 1; NaN on refusals)."""

    missing = [c for c in ("trial_id", "side", "category") if c not in reports.columns]
    if missing:
        raise ValueError(f"scored reports lack column(s) {missing}: pass report_scoring's table")
    bad = sorted(set(reports["category"]) - set(CATEGORIES), key=str)
    if bad:
        raise ValueError(f"scored reports have categories {bad}; expected {list(CATEGORIES)} (score_reports)")
    wide = reports.pivot_table(index="trial_id", columns="side", values="category", aggfunc="first")
    wide = wide.reindex(columns=list(SIDES)).dropna()
    scored = answers[answers["trial_id"].isin(wide.index)].copy()
    agent = scored["trial_id"].map(wide["agent"])
    partner = scored["trial_id"].map(wide["partner"])
    scored["refusal"] = (agent == "refusal") | (partner == "refusal")
    scored["difference"] = ((agent == "mention").astype(float) - (partner == "mention").astype(float)).where(
        ~scored["refusal"])
    return scored


def generated_report_rows(primary: pd.DataFrame, reports: pd.DataFrame | None) -> list[dict]:
    """The generated-report estimands (5: "the same estimands on generated reports";
    descriptive): per trial, whether the greedy answer mentions the agent item minus whether
    it mentions the neutral item, as the resolved outcome of 4.5 (:func:`report_outcomes`), so
    -1, 0 or 1; refusals are their own category (4.5), left out of the difference and
    reported as a rate per cell; raw cell means over the scored trials present; H1, H2 and H3
    in D3's form on them. ``primary`` is a model table, so excluded trials (a truncated
    answer included, 4.8) are already out. An answer the blinded scorer has not scored has no
    resolved outcome and is not read by the keyword rule alone: with none scored the rows say
    ``not_scored``."""
    hypotheses_ = ("H1", "H2", "H3")
    rows = primary[primary["generated_text"].notna()]
    if rows.empty:
        return [_row(f"{h}_generated_report", "not_scored", "no greedy answers were generated") for h in hypotheses_]
    scored = report_outcomes(rows, reports) if reports is not None and len(reports) else rows.iloc[:0]
    if scored.empty:
        return [_row(f"{h}_generated_report", "not_scored",
                     f"none of the {len(rows)} answers has the resolved 4.5 outcome (keyword rule, blinded scorer, "
                     "stem pass): run the blinded scorer on these answers (report_scoring)") for h in hypotheses_]
    unscored = len(rows) - len(scored)
    answered = scored[~scored["refusal"]]
    m = answered.groupby(["agent", "content"])["difference"].mean()
    effect = {a: m.get((a, "threat"), np.nan) - m.get((a, "harmless"), np.nan) for a in ("self", "peer", "person")}
    estimates = {"H1": float(np.mean(list(effect.values()))), "H2": float(effect["self"] - effect["peer"]),
                 "H3": float(effect["self"] - effect["person"])}
    note = (f"raw cell means over {len(answered)} answers, resolved 4.5 outcome (keyword rule, blinded scorer, "
            f"stem pass); {int(scored['refusal'].sum())} refusal(s) left out as their own category")
    if unscored:
        note += f"; {unscored} answer(s) without a resolved outcome not read"
    out = [_row(f"{h}_generated_report", "descriptive", f"{h} form of the agent-minus-neutral mention difference, "
                + note, mean=v) for h, v in estimates.items()]
    rate = scored.groupby(["agent", "content"])["refusal"].mean()
    out.append(_row("refusals_generated_report", "descriptive",
                    "refusal rate per cell (4.5: refusals form a separate category): "
                    + ", ".join(f"{a}/{c} {v:.2f}" for (a, c), v in rate.items()),
                    mean=float(scored["refusal"].mean())))
    return out


def class_rows(scores: pd.DataFrame, prefix: str, level: float, sesoi: float) -> list[dict]:
    """Secondary classes (generic aversive, surprise-only) and the protective choice, where
    scored; the surprise-only class 'matches' threats if its difference from the generic
    aversive class is practically equivalent by the same interval rule."""
    from scipy import stats


    out = []
    means = {}
    for cls in ("generic_aversive", "surprise_only"):
        part = scores[scores["block"] == f"{prefix}secondary_{cls}"]
        if part.empty:
            out.append(_row(f"class_{cls}", "not_scored", f"block {prefix}secondary_{cls} not scored in this design"))
            continue
        x = part["delta"].dropna().to_numpy()
        means[cls] = x
        half = stats.t.ppf(0.5 + level / 2, max(len(x) - 1, 1)) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.nan
        out.append(_row(f"class_{cls}", "descriptive", f"mean Delta over {len(x)} trials, t interval",
                        mean=float(x.mean()), hdi_low=float(x.mean() - half), hdi_high=float(x.mean() + half)))
    if len(means) == 2:
        a, b = means["surprise_only"], means["generic_aversive"]
        diff = a.mean() - b.mean()
        se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        half = stats.norm.ppf(0.5 + level / 2) * se
        decision = label(diff - half, diff + half, sesoi)
        out.append(_row("surprise_only_matches_threat", "descriptive",
                        "surprise-only minus generic aversive; 'matches' if practically equivalent",
                        mean=float(diff), hdi_low=float(diff - half), hdi_high=float(diff + half), label=decision.label))
    protective = scores[scores["block"] == f"{prefix}protective_choice"]
    if protective.empty:
        out.append(_row("protective_choice", "not_scored", f"block {prefix}protective_choice not scored in this design"))
    else:
        lp = protective["choice_logprobs"].dropna().map(lambda s: __import__("json").loads(s) if s else None).dropna()
        chose_a = lp.map(lambda v: v[0] >= v[1])
        rate = chose_a.groupby(protective.loc[chose_a.index, "content"]).mean()
        out.append(_row("protective_choice", "descriptive",
                        "rate of choosing the option linked to the self sentence: " +
                        ", ".join(f"{k} {v:.2f}" for k, v in rate.items())))
    return out
