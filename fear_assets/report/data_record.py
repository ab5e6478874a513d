"""The data record (protocol Appendix B) and the collection order (Appendix C step 5).

Appendix B: "One immutable record per trial: protocol hash; registration identifier once
issued; configuration and checkpoint identifiers with weight hashes; software versions;
frame, cell, name rotation, order and depth; token counts; per-sentence surprisal (name
token and remainder) and attention mass; the canonical reports and their teacher-forced
scores; the greedy answer and its two scorings; the recall-branch output; forced-choice
probabilities; binding-check results; probe outputs and activation checksums;
positive-control and condition flags; exclusion flags. Assignment logs are stored apart
from outcomes so that analysis runs on masked condition codes until scoring is locked."

Appendix C step 5: "Run: positive controls first; then all cells, interleaved".

Pure: stored tables in, one row per scored trial out. The record carries the masked
condition code only (the assignment key is never joined here). A field the pipeline does
not produce yet is null, and ``NULL_REASONS`` says why; nothing is invented.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from fear_assets.report.stage2 import Provenance

#: Fields that are null in every record today, with the reason (shown in the asset's metadata).
NULL_REASONS = {
    "registration_id": "no Stage 1 registration identifier has been issued (Appendix C step 4 happens outside "
                       "the pipeline); filled once the record carries one",
}

#: Columns of the record, in Appendix B's order.
RECORD_COLUMNS = [
    "collection_position", "scored_at", "scored_in_run",
    "protocol", "protocol_version", "settings_sha256", "bank_sha256", "registration_id",
    "family", "checkpoint", "weight_sha256", "software_versions",
    "trial_id", "block", "item_id", "fear", "condition_code", "rotation", "order", "depth", "depth_tokens",
    "n_tokens", "n_prefix_tokens", "n_distractor_tokens",
    "sentence_surprisal", "attention_agent", "attention_partner",
    "canonical_reports", "teacher_forced_scores", "report_score_agent", "report_score_partner", "delta",
    "generated_text", "generation_truncated", "report_scorings",
    "recall_scores", "delta_recall",
    "p_option1", "fc_choice", "fc_correct", "choice_logprobs",
    "binding_result",
    "probe_output", "features_file", "feature_row", "features_sha256",
    "positive_control", "block_kind", "reader",
    "excluded_context", "exclusion_reason", "answer_exceeds_context",
]


def is_positive_control(block: str) -> bool:
    """Positive-control blocks (4.6), pilot or confirmatory, with their baselines."""
    return block.startswith("control_") or block.startswith("pilot_control_")


def collection_order(trials: pd.DataFrame) -> pd.Series:
    """Position (0-based) of each trial in the registered collection order (Appendix C step
    5): every positive-control trial first, then all other trials with the cells
    interleaved: one trial of each condition code in turn (codes in sorted order), so no
    cell is collected as a run. Ties inside a code follow the trial id. Deterministic: the
    same trials give the same positions."""
    for col in ("trial_id", "block", "condition_code"):
        if col not in trials.columns:
            raise ValueError(f"collection_order needs column {col!r} (from the stored scores)")
    t = trials[["trial_id", "block", "condition_code"]].copy()
    t["control"] = t["block"].map(is_positive_control)
    t = t.sort_values(["condition_code", "trial_id"], kind="stable")
    # Rank of a trial within its code and phase: the interleaving round it belongs to.
    t["round"] = t.groupby(["control", "condition_code"]).cumcount()
    t = t.sort_values(["control", "round", "condition_code", "trial_id"], ascending=[False, True, True, True],
                      kind="stable")
    return pd.Series(range(len(t)), index=t.index, name="collection_position").reindex(trials.index)


@dataclass(frozen=True)
class RecordInputs:
    """The stored assets the record is joined from (one family)."""

    scores: pd.DataFrame
    trial_table: pd.DataFrame
    sentence_surprisal: pd.DataFrame
    report_scoring: pd.DataFrame
    binding_results: pd.DataFrame
    probe_outputs: pd.DataFrame
    model_manifest: pd.DataFrame
    record: dict
    control_scores: pd.DataFrame | None  # pilot_control_scores: the positive controls (4.6)
    #: (asset, depth) -> (materialisation timestamp, run id) of the stored partition that holds
    #: the trial: scoring stores time per partition, not per trial.
    scored_at: dict[tuple[str, str], tuple[float, str]]
    #: confirmatory_scores: the confirmatory collection (Appendix C step 5); empty for a
    #: design that scores no confirmatory block (the embedded demo).
    confirmatory_scores: pd.DataFrame | None = None


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def data_record(inputs: RecordInputs) -> pd.DataFrame:
    """Join one record per scored trial (Appendix B); see the module docstring."""
    # Each trial keeps the name of the stored asset it came from (its run and time below).
    named = [(inputs.scores, "scores"), (inputs.control_scores, "control_scores"),
             (inputs.confirmatory_scores, "confirmatory_scores")]
    parts = [p.assign(_source=name) for p, name in named if p is not None and len(p)]
    if not parts:
        raise ValueError("scores is empty: score the family's depth partitions before building its data record")
    s = pd.concat(parts, ignore_index=True)
    out = pd.DataFrame(index=s.index)
    out["collection_position"] = collection_order(s).astype("int64")
    source = s["_source"]
    out["scored_at"] = [inputs.scored_at.get((a, d), (None, None))[0] for a, d in zip(source, s["depth"])]
    out["scored_in_run"] = [inputs.scored_at.get((a, d), (None, None))[1] for a, d in zip(source, s["depth"])]
    rec = inputs.record
    out["protocol"] = rec.get("protocol")
    out["protocol_version"] = rec.get("protocol_version")
    out["settings_sha256"] = s["settings_sha256"]
    out["bank_sha256"] = s["bank_sha256"]
    out["registration_id"] = rec.get("registration_id")  # None until issued (NULL_REASONS)
    out["family"] = s["family"]
    out["checkpoint"] = s["checkpoint"]
    m = inputs.model_manifest
    weights = {c: _json(dict(zip(g["file"], g["sha256"]))) for c, g in m.groupby("checkpoint")}
    versions = {c: str(g["versions"].iloc[0]) for c, g in m.groupby("checkpoint")}
    out["weight_sha256"] = s["checkpoint"].map(weights)
    out["software_versions"] = s["checkpoint"].map(versions)
    for col in ("trial_id", "block", "item_id", "fear", "condition_code", "rotation", "order", "depth", "n_tokens"):
        out[col] = s[col]
    tt = inputs.trial_table.set_index("trial_id")
    for col in ("depth_tokens", "n_prefix_tokens", "n_distractor_tokens"):
        out[col] = s["trial_id"].map(tt[col]) if col in tt.columns else None
    out["canonical_reports"] = s["trial_id"].map(tt["continuations"]) if "continuations" in tt.columns else None
    # Per-sentence surprisal of the frame's sentences at this rotation and option (every cell's,
    # keyed by agent and content): the trial's own cell is not named, so the record stays masked.
    ss = inputs.sentence_surprisal
    surprisal = {}
    for (item, rot, opt), g in ss.groupby(["item_id", "rotation", "option"]):
        surprisal[(item, int(rot), int(opt))] = _json(
            [{"agent": r.agent, "content": r.content, "name_nll": r.name_nll, "rest_nll": r.rest_nll,
              "n_tokens": r.n_tokens, "n_name_tokens": r.n_name_tokens} for r in g.itertuples(index=False)])
    out["sentence_surprisal"] = [surprisal.get((i, int(r), int(o))) for i, r, o in
                                 zip(s["item_id"], s["rotation"], s["content_option"])]
    out["attention_agent"] = s["attention_agent"]
    out["attention_partner"] = s["attention_partner"]
    score_cols = [c for c in s.columns if c.startswith(("agent_", "partner_", "base_agent_", "base_partner_"))
                  and "recall" not in c]
    out["teacher_forced_scores"] = [_json(row) for row in s[score_cols].to_dict("records")]
    for col in ("report_score_agent", "report_score_partner", "delta", "generated_text", "generation_truncated"):
        out[col] = s[col]
    rs = inputs.report_scoring
    scorings = {t: _json(g[["side", "rule", "scorer", "final", "category"]].to_dict("records"))
                for t, g in rs.groupby("trial_id")} if len(rs) else {}
    out["report_scorings"] = s["trial_id"].map(scorings)
    recall_cols = [c for c in s.columns if "recall" in c and c != "delta_recall"]
    out["recall_scores"] = [_json(row) for row in s[recall_cols].to_dict("records")]
    out["delta_recall"] = s["delta_recall"]
    for col in ("p_option1", "fc_choice", "fc_correct", "choice_logprobs"):
        out[col] = s[col]
    b = inputs.binding_results
    binding = {r.item_id: _json({"passes": bool(r.passes), "n_correct": int(r.n_correct), "n_checks": int(r.n_checks)})
               for r in b.itertuples(index=False)} if len(b) else {}
    out["binding_result"] = s["item_id"].map(binding)
    p = inputs.probe_outputs
    probes = {t: _json(g[["frame_set", "p_correct", "log_odds", "correct"]].to_dict("records"))
              for t, g in p.groupby("trial_id")} if len(p) else {}
    out["probe_output"] = s["trial_id"].map(probes)
    for col in ("features_file", "feature_row", "features_sha256"):
        out[col] = s[col]
    out["positive_control"] = s["block"].map(is_positive_control)
    for col in ("block_kind", "reader", "excluded_context", "exclusion_reason", "answer_exceeds_context"):
        out[col] = s[col]
    out = out[RECORD_COLUMNS].sort_values("collection_position").reset_index(drop=True)
    return out


def to_parquet_bytes(record: pd.DataFrame) -> tuple[bytes, str]:
    """The record as Parquet bytes and their sha256 (same record -> same bytes)."""
    buffer = io.BytesIO()
    record.to_parquet(buffer, index=False, engine="pyarrow", compression="zstd")
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def scored_at(provenance: Mapping[str, Sequence[Provenance]]) -> dict[tuple[str, str], tuple[float, str]]:
    """(asset, depth) -> (materialisation timestamp, run id) from each scored asset's stored
    partitions (a ``family|depth`` partition keys its depth half; scoring stores time per
    partition, not per trial)."""
    out = {}
    for name, sources in provenance.items():
        for p in sources:
            out[(name, p.partition.split("|")[0] if "|" in p.partition else p.partition)] = (p.timestamp, p.run_id)
    return out


@dataclass(frozen=True)
class WrittenRecord:
    """The written data record: its table (with the Parquet file's sha256) and the facts shown."""

    table: pd.DataFrame
    path: str
    sha256: str
    records: int
    positive_controls: int


def write_data_record(tables: Mapping[str, pd.DataFrame], confirmatory: Mapping[str, pd.DataFrame | None],
                      scored: Mapping[str, Sequence[Provenance]], path: Path) -> WrittenRecord:
    """The data record of one family (Appendix B), joined from its stored tables in the
    registered collection order (Appendix C step 5) and written to ``path`` as Parquet.
    ``tables``: the pilot inputs by their report names; ``confirmatory``: the confirmatory
    scores and trial table where stored (None or empty for a design that scores no
    confirmatory block); ``scored``: each scored asset's stored partitions."""
    trial_table = pd.concat([t for t in (tables["trial_table"], confirmatory["confirmatory_trial_table"])
                             if t is not None and len(t)], ignore_index=True)
    record = json.loads(tables["registration_record"]["record_json"].iloc[0])
    table = data_record(RecordInputs(tables["scores"], trial_table, tables["surprisal"], tables["report_scoring"],
                                     tables["binding_results"], tables["probe_outputs"], tables["model_manifest"],
                                     record, tables["control_scores"], scored_at(scored),
                                     confirmatory["confirmatory_scores"]))
    data, digest = to_parquet_bytes(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return WrittenRecord(table.assign(record_sha256=digest), str(path), digest, len(table),
                         int(table["positive_control"].sum()))
