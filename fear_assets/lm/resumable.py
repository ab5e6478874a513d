"""Scoring that resumes where it stopped (Inspect's ``eval-retry`` in spirit; issue 16).

A partition's document requests (any dataclass with a ``key``, hashed as data: the
library never reads their fields) are cut into fixed chunks of consecutive requests. Each
finished chunk is written at once to one Parquet file, atomically (temporary name, fsync,
``os.replace``, fsync of the directory: ``core.files.write_parquet_atomically``), named by the
sha256 of its requests' hashes. A request's hash covers the whole request as data (every
branch text, continuation, choice, span) and a salt naming everything else that decides
its readout (checkpoint, reader, context window, answer length, probe layers, end tokens,
the settings' and bank's sha256). A rerun after a crash recomputes every hash, reads the
chunks whose file exists and whose stored hashes are exactly the chunk's, and scores only
the others; a chunk written for another request set (another hash) is never read, and
is deleted once the partition is assembled.

The partition is always assembled from the chunk files, in request order, whether or not
the run was interrupted, so an interrupted-then-resumed partition is byte-identical to an
uninterrupted one (same chunks, same batches, same serialisation). The store then
replaces the partition in one transaction (its own IO manager), as before.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import pandas as pd

from fear_assets.core.files import write_parquet_atomically
from fear_assets.core.hashing import sha256_obj

#: Documents per chunk file: what a crash can cost at most (not a registered number: it
#: changes no score, only how much work a rerun repeats and how often a file is written).
CHUNK_DOCUMENTS = 32
CHUNK_PREFIX, CHUNK_SUFFIX = "chunk-", ".parquet"
#: Columns of a chunk file: one row per document request.
CHUNK_COLUMNS = ["request_hash", "request", "readout", "long", "feature"]



class Keyed(Protocol):
    """What a chunk holds: one unit of scoring as a dataclass (the design stage's document
    request), hashed as data, whose ``key`` names its readout row."""

    key: str


#: ``score(requests, progress)`` -> (long rows, readouts, features), as
#: ``design.document_scores.score_requests``.
ScoreFn = Callable[[Sequence[Any], Callable[[int, int, float], None] | None],
                   tuple[pd.DataFrame, pd.DataFrame, np.ndarray]]


class ChunkError(ValueError):
    """A chunk file that exists but cannot be what its name says."""


def request_hash(request: Keyed, salt: str) -> str:
    """sha256 of one document request as data, with the salt of everything else it depends on."""
    return sha256_obj([salt, asdict(request)])


def scoring_salt(**parts) -> str:
    """The salt of a partition's requests: every input of a readout that is not the request."""
    return sha256_obj({k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in sorted(parts.items())})


@dataclass(frozen=True)
class Chunk:
    index: int
    requests: tuple[Keyed, ...]
    hashes: tuple[str, ...]

    @property
    def digest(self) -> str:
        return sha256_obj(list(self.hashes))

    @property
    def filename(self) -> str:
        return f"{CHUNK_PREFIX}{self.digest}{CHUNK_SUFFIX}"


def plan_chunks(requests: Sequence[Keyed], salt: str, size: int = CHUNK_DOCUMENTS) -> list[Chunk]:
    """Consecutive chunks of ``size`` requests, each named by its requests' hashes."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1 document, got {size}")
    hashes = [request_hash(r, salt) for r in requests]
    if len(set(hashes)) != len(hashes):
        dup = next(h for h in hashes if hashes.count(h) > 1)
        raise ValueError(f"two document requests of the partition are identical (hash {dup[:12]}): "
                         "each trial's document must be requested once; check the trial table for duplicate trial ids")
    return [Chunk(i // size, tuple(requests[i:i + size]), tuple(hashes[i:i + size]))
            for i in range(0, len(requests), size)]


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a readout value of type {type(value).__name__} cannot be stored in a chunk")


def chunk_frame(chunk: Chunk, long: pd.DataFrame, readouts: pd.DataFrame, features: np.ndarray) -> pd.DataFrame:
    """One row per document of the chunk: its readout, its long rows and its feature vector."""
    by_request = {}
    if len(long):
        for rec in long.to_dict("records"):
            by_request.setdefault(rec["request"], []).append(rec)
    records = {r["request"]: r for r in readouts.to_dict("records")}
    rows = []
    for req, h in zip(chunk.requests, chunk.hashes):
        if req.key not in records:
            raise ChunkError(f"the scoring callable returned no readout for document {req.key!r}: "
                             "it must return one readout row per document request")
        readout = records[req.key]
        feature = None
        row = readout.get("feature_row")
        if row is not None and not (isinstance(row, float) and math.isnan(row)) and int(row) >= 0:
            feature = np.ascontiguousarray(features[int(row)], dtype=np.float32).tobytes()
        rows.append({"request_hash": h, "request": req.key,
                     "readout": json.dumps(readout, default=_json_default),
                     "long": json.dumps(by_request.get(req.key, []), default=_json_default),
                     "feature": feature})
    return pd.DataFrame(rows, columns=CHUNK_COLUMNS)


def write_chunk(directory: Path, chunk: Chunk, frame: pd.DataFrame) -> Path:
    """The chunk's file, written atomically (old content or all of the new, never a part)."""

    path = Path(directory) / chunk.filename
    write_parquet_atomically(frame, path)
    return path


def read_chunk(directory: Path, chunk: Chunk) -> pd.DataFrame | None:
    """The chunk's stored rows, or None when no file holds exactly this chunk's requests."""
    import duckdb

    path = Path(directory) / chunk.filename
    if not path.is_file():
        return None
    con = duckdb.connect()
    try:
        frame = con.execute("select * from read_parquet(?)", [str(path)]).df()
    except duckdb.Error:
        return None  # unreadable (not a complete Parquet file): scored again, never trusted
    finally:
        con.close()
    if list(frame.get("request_hash", [])) != list(chunk.hashes):
        return None  # stored for another request set: never reused
    return frame


@dataclass
class Progress:
    """Where a resumable partition stands (documents, documents/s of this run, ETA)."""

    label: str
    total: int
    done: int = 0
    reused: int = 0
    scored: int = 0
    elapsed: float = 0.0
    chunks_total: int = 0
    chunks_reused: int = 0

    @property
    def rate(self) -> float:
        return self.scored / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None

    def message(self) -> str:
        eta = "unknown" if self.eta is None else f"{self.eta:.0f} s"
        return (f"{self.label}: {self.done}/{self.total} documents ({self.reused} from finished chunks, "
                f"{self.scored} scored now), {self.rate:.2f} docs/s, ETA {eta}")

    def metadata(self) -> dict:
        return {"documents": self.total, "documents done": self.done,
                "documents reused from finished chunks": self.reused, "documents scored in this run": self.scored,
                "documents/s": round(self.rate, 3), "ETA s": None if self.eta is None else round(self.eta, 1),
                "chunks": self.chunks_total, "chunks reused": self.chunks_reused}


@dataclass
class ResumableResult:
    long: pd.DataFrame
    readouts: pd.DataFrame
    features: np.ndarray
    progress: Progress
    stale_removed: list[str] = field(default_factory=list)


def assemble_chunks(frames: Sequence[pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """The scoring loop's three outputs from chunk rows, in request order; feature rows are
    renumbered across the partition exactly as one uninterrupted loop numbers them."""
    long_rows, readouts, features = [], [], []
    for frame in frames:
        for rec in frame.to_dict("records"):
            readout = json.loads(rec["readout"])
            long_rows.extend(json.loads(rec["long"]))
            if rec["feature"] is not None and not (isinstance(rec["feature"], float) and math.isnan(rec["feature"])):
                readout["feature_row"] = len(features)
                features.append(np.frombuffer(bytes(rec["feature"]), dtype=np.float32))
            readouts.append(readout)
    dim = features[0].shape[0] if features else 0
    return (pd.DataFrame(long_rows), pd.DataFrame(readouts),
            np.stack(features) if features else np.zeros((0, dim), np.float32))


def score_resumably(requests: Sequence[Keyed], score: ScoreFn, directory: str | Path, salt: str, *,
                    label: str = "scores", chunk_documents: int = CHUNK_DOCUMENTS,
                    report: Callable[[Progress], None] | None = None,
                    after_chunk: Callable[[Chunk, Path], None] | None = None) -> ResumableResult:
    """Score ``requests`` chunk by chunk through ``score``, reusing every finished chunk in
    ``directory``; returns the three outputs of ``score`` for all requests, assembled from
    the chunk files. ``report`` gets the progress after every chunk; ``after_chunk`` the
    chunk and its file once it is on disk (the fault suite's kill points)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chunks = plan_chunks(requests, salt, chunk_documents)
    progress = Progress(label=label, total=len(requests), chunks_total=len(chunks))
    frames: list[pd.DataFrame | None] = [read_chunk(directory, c) for c in chunks]
    for chunk, frame in zip(chunks, frames):
        if frame is not None:
            progress.reused += len(chunk.requests)
            progress.chunks_reused += 1
    progress.done = progress.reused
    if report:
        report(progress)
    started = time.perf_counter()
    for i, chunk in enumerate(chunks):
        if frames[i] is not None:
            continue
        long, readouts, features = score(list(chunk.requests), None)
        frame = chunk_frame(chunk, long, readouts, features)
        path = write_chunk(directory, chunk, frame)
        # Read back what was written: the partition is made of the files, never of memory.
        frames[i] = read_chunk(directory, chunk)
        if frames[i] is None:
            raise ChunkError(f"{path}: the chunk just written does not read back; check the disk under {directory}")
        progress.scored += len(chunk.requests)
        progress.done += len(chunk.requests)
        progress.elapsed = time.perf_counter() - started
        if after_chunk:
            after_chunk(chunk, path)
        if report:
            report(progress)
    wanted = {c.filename for c in chunks}
    stale = sorted(p.name for p in directory.glob(f"{CHUNK_PREFIX}*{CHUNK_SUFFIX}") if p.name not in wanted)
    for name in stale:
        (directory / name).unlink(missing_ok=True)
    long, readouts, features = assemble_chunks([f for f in frames if f is not None])
    return ResumableResult(long, readouts, features, progress, stale)


def chunk_directory(cache_dir: str | Path, family: str, partition: str, reader: str) -> Path:
    """Where a partition's finished chunks wait (beside the features: ``data/scoring_chunks/``)."""
    return Path(cache_dir).parent / "scoring_chunks" / family / partition / reader


def discard_chunks(cache_dir: str | Path, family: str, partition: str) -> None:
    """Remove a partition's chunks once the store holds the partition (they are then redundant)."""
    target = Path(cache_dir).parent / "scoring_chunks" / family / partition
    if target.is_dir():
        shutil.rmtree(target)


__all__ = ["CHUNK_DOCUMENTS", "Chunk", "ChunkError", "Keyed", "Progress", "ResumableResult", "assemble_chunks",
           "chunk_directory", "chunk_frame", "discard_chunks", "plan_chunks", "read_chunk",
           "request_hash", "score_resumably", "scoring_salt", "write_chunk"]
