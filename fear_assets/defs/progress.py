"""Scoring progress in the run log and the UI (an asset observation per step of progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import dagster as dg

from fear_assets.lm.resumable import (Progress, ResumableResult, ScoreFn, chunk_directory, score_resumably,
                                      scoring_salt)
from fear_assets.design.requests import DocumentRequest


def dagster_progress(context, label: str) -> Callable[[Progress], None]:
    """Progress to the run log and, as an asset observation, to the run's metadata in the UI."""
    last = [-1.0]

    def report(p: Progress) -> None:
        context.log.info(p.message())
        if p.elapsed - last[0] >= 15 or p.done == p.total or last[0] < 0:
            last[0] = p.elapsed
            context.log_event(dg.AssetObservation(asset_key=context.asset_key, partition=context.partition_key,
                                                  metadata={"progress": label, **{k: v for k, v in p.metadata().items()
                                                                                  if v is not None}}))

    return report


def score_partition(context, requests: Sequence[DocumentRequest], score: ScoreFn, cache_dir: str | Path,
                    family: str, partition: str, reader: str, **salt) -> ResumableResult:
    """The ``scores`` assets' call: one reader's requests of a partition, resumably, with
    progress to the run log and the UI; ``salt`` names every non-request input of a readout."""
    label = f"{family} {partition} [{reader}]"
    return score_resumably(requests, score, chunk_directory(cache_dir, family, partition, reader),
                           scoring_salt(family=family, reader=reader, **salt), label=label,
                           report=dagster_progress(context, label))
