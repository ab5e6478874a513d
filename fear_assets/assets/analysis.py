"""Stage "analysis" (protocol 6.1-6.2): the H4 analysis on probe log-odds.

The remaining confirmatory models (H1-H3 on Delta, H5, the gates, the controls, the
secondary estimands) come with the analysis issue; the primary model they use is
``fear_assets.analysis.primary_model``.
"""

import json
from pathlib import Path

import arviz as az
import dagster as dg
import pandas as pd

import fear_assets
from fear_assets.analysis.primary_model import (Priors, build_model, cell_means, convergence, hypotheses,
                                                posterior_draws, prepare, sample)
from fear_assets.analysis.unmasking import unmask
from fear_assets.hashing import derived_seed, sha256_file
from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.registration.freeze import read_record
from fear_assets.resources.protocol import ProtocolResource

GROUP = "analysis"


def convergence_problems(diag: dict, rule: dict) -> list[str]:
    out = []
    if diag["max_rhat"] > rule["rhat_max"]:
        out.append(f"R-hat {diag['max_rhat']:.3f} > {rule['rhat_max']}")
    if diag["min_ess_bulk"] < rule["ess_bulk_min"]:
        out.append(f"bulk ESS {diag['min_ess_bulk']:.0f} < {rule['ess_bulk_min']}")
    if diag["min_ess_tail"] < rule["ess_tail_min"]:
        out.append(f"tail ESS {diag['min_ess_tail']:.0f} < {rule['ess_tail_min']}")
    if diag["divergences"] > rule["divergences_max"]:
        out.append(f"{diag['divergences']} divergences")
    return out


def h4_data(outputs: pd.DataFrame, surprisal: pd.DataFrame, bank, neutral_option: int) -> pd.DataFrame:
    """Model table of H4: one row per probed document version, with the registered
    covariates (agent sentence's name NLL; rest NLL minus the partner's)."""
    d = outputs.rename(columns={"fold_rotation": "rotation", "content_option": "option"}).copy()
    agent = surprisal[surprisal["agent"] != "partner"][["item_id", "rotation", "agent", "content", "option",
                                                        "name_nll", "rest_nll"]]
    partner = surprisal[(surprisal["agent"] == "partner") & (surprisal["option"] == neutral_option)][
        ["item_id", "rotation", "rest_nll"]].rename(columns={"rest_nll": "partner_rest_nll"})
    d = d.merge(agent, on=["item_id", "rotation", "agent", "content", "option"], how="left")
    d = d.merge(partner, on=["item_id", "rotation"], how="left")
    d["surprisal_name"] = d["name_nll"]
    d["surprisal_rest"] = d["rest_nll"] - d["partner_rest_nll"]
    d["depth"] = "d" + d["depth_index"].astype(str)
    d["frame"] = d["item_id"]
    d["fear"] = [bank.item(i).group for i in d["item_id"]]
    d["unit"] = d["item_id"] + "|r" + d["rotation"].astype(str) + "|o" + d["order"].astype(str) + "|" + d["depth"]
    d["document"] = d["unit"] + "|" + d["condition_code"]
    return d


@dg.asset(
    group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
    kinds={"duckdb", "pymc"},
    ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
         "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)},
)
def h4_posterior(context: dg.AssetExecutionContext, protocol: ProtocolResource, probe_outputs: pd.DataFrame,
                 probe_controls: pd.DataFrame, pilot_depths: pd.DataFrame, sentence_surprisal: pd.DataFrame,
                 scores: pd.DataFrame, assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """H4, carriage (protocol 6.1): the primary model on probe log-odds, both content
    versions of each document entered separately, with an option term and a document
    intercept; the H2 contrast on that scale averaged over the band depths; 99% HDI and the
    decision rule. Fitted on masked codes; the assignment key is joined only once scoring is
    locked. The embedded family has probe documents for its pilot frame only, so its H4 is
    descriptive; the flags say whether H4 is uninterpretable (controls) or estimation-only
    (ceiling)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    frozen = read_record(protocol.registration_dir)
    outputs = unmask(probe_outputs, assignment_key, list(family.depth_keys), scores, frozen)
    rows = []
    for frame_set, part in outputs.groupby("frame_set"):
        data = h4_data(part, sentence_surprisal, bank, int(settings.design["neutral_partner_option"]))
        present = lambda col: sorted(data[col].unique(), key=str)
        levels = {"agent": ["self", "peer", "person"], "content": ["threat", "harmless"],
                  "depth": present("depth"), "order": present("order"), "option": present("option"),
                  "rotation": present("rotation"), "fear": [f for f in settings.fears if f in set(data["fear"])]}
        d = prepare(data, levels, outcome="log_odds", document="document")
        seed = derived_seed(settings.master_seed, "h4", family_key, frame_set) % (2**31)
        sampler = settings.section("sampler")
        idata = sample(build_model(d, Priors.from_settings(settings)), int(sampler["draws"]), int(sampler["tune"]),
                       int(sampler["chains"]), seed)
        band = [f"d{b}" for b in pilot_depths["depth_band"].iloc[0].split(",") if f"d{b}" in levels["depth"]]
        mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)
        h4 = hypotheses(mu)["H2"]
        low, high = az.hdi(h4, hdi_prob=settings.decision["hdi_prob"])
        decision = fear_assets.label(float(low), float(high), settings.decision["sesoi"])
        diag = convergence(idata)
        path = Path(protocol.cache_dir).parent / "posteriors" / family_key / f"h4_{frame_set}.nc"
        path.parent.mkdir(parents=True, exist_ok=True)
        idata.to_netcdf(str(path))
        ctrl = probe_controls[probe_controls["frame_set"] == frame_set]
        flags = []
        problems = convergence_problems(diag, settings.section("convergence"))
        if problems:
            flags.append("NOT CONVERGED (" + "; ".join(problems) + "): the label is not to be read")
        if not bool(ctrl["h4_interpretable"].iloc[0]):
            flags.append("H4 uninterpretable: a control probe decodes away from chance")
        if "h4_estimation_only" in ctrl and bool(ctrl["h4_estimation_only"].fillna(False).iloc[0]):
            flags.append("H4 estimation-only: probe accuracy above the ceiling at the band depths")
        if frame_set == "pilot":
            flags.append(f"pilot frames only ({data['frame'].nunique()}): descriptive")
        rows.append({"family": family_key, "frame_set": frame_set, "hypothesis": "H4", "mean": float(h4.mean()),
                     "hdi_low": float(low), "hdi_high": float(high), "label": decision.label,
                     "practically_meaningful": decision.practically_meaningful, "band_depths": ",".join(band),
                     "documents": len(data), **diag, "flags": "; ".join(flags), "draws_file": str(path),
                     "draws_sha256": sha256_file(path)})
        context.log.info(f"H4 {frame_set}: mean {h4.mean():.3f}, 99% HDI [{low:.3f}, {high:.3f}] -> {decision.label}")
    table = pd.DataFrame(rows)
    return dg.Output(table, metadata={
        "H4": dg.MetadataValue.md(table[["frame_set", "mean", "hdi_low", "hdi_high", "label", "max_rhat",
                                         "min_ess_bulk", "divergences", "flags"]].round(4).to_markdown(index=False)),
    })


@dg.asset_check(asset=h4_posterior, blocking=True, description=(
    "Convergence of the H4 fit: R-hat <= 1.01, bulk and tail ESS >= 400 for the reported "
    "contrast's parameters, no divergences (registered under 'convergence')."))
def h4_converged(h4_posterior: pd.DataFrame) -> dg.AssetCheckResult:
    bad = h4_posterior[h4_posterior["flags"].str.contains("NOT CONVERGED")]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="converged" if bad.empty else
        "not converged: " + " | ".join(f"{r.frame_set}: {r.flags}" for r in bad.itertuples()) +
        ". What to change: more tuning and draws, more frames (one frame cannot separate frame effects from the "
        "intercept), or, where the outcome is constant (probe at the clip), nothing: H4 is estimation-only.",
        metadata={"diagnostics": dg.MetadataValue.md(h4_posterior[["frame_set", "max_rhat", "min_ess_bulk",
                                                                   "min_ess_tail", "divergences"]].to_markdown(index=False))},
    )
