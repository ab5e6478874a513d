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

from fear_assets.analysis.data import levels_of
from fear_assets.analysis.exclusions import exclusion_rates
from fear_assets.analysis.frequentist import label_disagreements, mixed_model_contrasts
from fear_assets.analysis.mediation import attention_mediation, h2_with_without_covariates
from fear_assets.analysis.topic_frequency import load_topic_counts
from fear_assets.pilot.report_rule import agent_keywords, mentions, partner_keywords


def _row(name: str, status: str, note: str, **numbers) -> dict:
    base = {"contrast": name, "kind": "secondary", "status": status, "note": note, "mean": np.nan,
            "hdi_low": np.nan, "hdi_high": np.nan, "label": "", "practically_meaningful": False}
    base.update(numbers)
    return base


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
                        f"converged: {freq.attrs.get('converged')}; Bayesian label {r['bayesian_label']}"
                        + ("; DISAGREES (reported, not applied)" if r["disagree"] else ""),
                        mean=r["estimate"], hdi_low=r["ci_low"], hdi_high=r["ci_high"],
                        label=r["frequentist_label"], kind="sensitivity"))
    return out


def mediation_rows(primary: pd.DataFrame, fears: Sequence[str], band: Sequence[str], level: float) -> list[dict]:
    """5: mediation of H2 by attention mass and H2 with minus without the surprisal
    covariates, each with its frame-clustered ``level`` interval (``mediation``). Each row
    says its status: ``descriptive`` (estimated with its interval), ``not_available`` (no
    attention mass recorded) or ``not_estimable`` (the design cannot give the interval, e.g.
    a single frame), never a number without interval and never a hidden failure."""
    from fear_assets.analysis.mediation import NotEstimable

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


def generated_report_rows(primary: pd.DataFrame, bank, neutral_option: int) -> list[dict]:
    """The generated-report estimands (5: "the same estimands on generated reports";
    descriptive): per trial, whether the greedy answer mentions the agent item minus whether
    it mentions the neutral item (keyword rule, 4.5), so -1, 0 or 1; its raw cell means over
    the trials present; H1, H2 and H3 in D3's form on them. ``primary`` is a model table, so
    excluded trials (a truncated answer included, 4.8) are already out."""
    rows = primary[primary["generated_text"].notna()]
    if rows.empty:
        return [_row(f"{h}_generated_report", "not_scored", "no greedy answers were generated") for h in ("H1", "H2", "H3")]

    def difference(r) -> float:
        item = bank.item(r.item_id)
        verb = item.verb("person" if r.agent == "person" else "assistant", r.content)
        agent = mentions(r.generated_text, agent_keywords(verb, item.content_options[int(r.option) - 1]))
        neutral = mentions(r.generated_text, partner_keywords(item.partner.sentence,
                                                              item.partner.content_options[neutral_option - 1]))
        return float(agent) - float(neutral)

    value = pd.Series([difference(r) for r in rows.itertuples()], index=rows.index, dtype=float)
    m = value.groupby([rows["agent"], rows["content"]]).mean()
    effect = {a: m.get((a, "threat"), np.nan) - m.get((a, "harmless"), np.nan) for a in ("self", "peer", "person")}
    estimates = {"H1": float(np.mean(list(effect.values()))), "H2": float(effect["self"] - effect["peer"]),
                 "H3": float(effect["self"] - effect["person"])}
    return [_row(f"{h}_generated_report", "descriptive",
                 f"{h} form of the agent-minus-neutral mention difference, raw cell means over {len(rows)} answers "
                 f"(keyword rule)", mean=v) for h, v in estimates.items()]


def class_rows(scores: pd.DataFrame, prefix: str, level: float, sesoi: float) -> list[dict]:
    """Secondary classes (generic aversive, surprise-only) and the protective choice, where
    scored; the surprise-only class 'matches' threats if its difference from the generic
    aversive class is practically equivalent by the same interval rule."""
    from scipy import stats

    from fear_assets.reading.decision import label

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
