"""A real scoring partition for the fault suite's kill -9 tests (issue 16).

One Dagster asset, ``fault_scores``, scores one partition exactly as the ``scores`` asset
does (``resumable.score_resumably`` over ``scoring.score_requests`` with a tiny random
model on the embedded tokenizer's vocabulary, ``trial_scores.assemble``) and stores it
through the project's IO manager on an embedded DuckDB file. The requests (data, built
before any model runs) come from a pickle the test writes, so the subprocess spends its
time scoring, not rebuilding a design.

Run as a subprocess: ``python -m fear_assets_tests.fault_scoring JOB DB CHUNKS GENERATION
[--die-in-store]``. After every chunk file it prints ``FAULT-CHUNK <index>`` (the test's
kill points); ``--die-in-store`` makes the process SIGKILL itself inside the store's
transaction, after the partition's old rows are deleted and the new ones inserted, before
the commit (the worst moment of a write).
"""



import hashlib
import os
import pickle
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pandas as pd

CHUNK_DOCUMENTS = 3
PARTITION = "p"
PARTITIONS = dg.StaticPartitionsDefinition([PARTITION])


class FaultScoringConfig(dg.Config):
    generation: str = "new"
    keep_chunks: bool = False
    # wait pause_s after chunk pause_after_chunk is written: a test's kill lands mid-partition (issue 27)
    pause_after_chunk: int = -1
    pause_s: float = 0.0


def tiny_model(vocab_size: int):
    """The same seeded random Llama in every process (CPU, float32)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return AutoModelForCausalLM.from_config(config).eval()


@contextmanager
def one_thread():
    """One BLAS thread, so every process sums in the same order (byte-identical floats)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_job(path: Path, rows: pd.DataFrame, requests: list, tokenizer, max_new_tokens: int = 4) -> Path:
    with open(path, "wb") as f:
        pickle.dump({"rows": rows, "requests": requests, "tokenizer": tokenizer, "max_new_tokens": max_new_tokens}, f)
    return path


def build_defs(job: str | Path, db: str | Path, chunks: str | Path, pool: str | None = None) -> dg.Definitions:
    """``pool="gpu"`` puts the step in the model pool, as the project's scoring assets are."""
    from fear_assets.defs.resources.store import store_io_manager

    @dg.asset(partitions_def=PARTITIONS, metadata={"partition_expr": "fault_partition"}, pool=pool)
    def fault_scores(context: dg.AssetExecutionContext, config: FaultScoringConfig):
        from fear_assets.lm.engine import TeacherForcedEngine
        from fear_assets.defs.progress import dagster_progress
        from fear_assets.lm.resumable import score_resumably, scoring_salt
        from fear_assets.design.document_scores import ScoringSettings, score_requests
        from fear_assets.design.trial_scores import assemble

        with open(job, "rb") as f:
            payload = pickle.load(f)
        tokenizer = payload["tokenizer"]
        settings = ScoringSettings(context_window=4096, max_new_tokens=payload["max_new_tokens"],
                                   layers_fraction_from=1 / 3)
        with one_thread():
            engine = TeacherForcedEngine(tiny_model(len(tokenizer)))

            def announce(chunk, path):
                print(f"FAULT-CHUNK {chunk.index}", flush=True)
                if chunk.index == config.pause_after_chunk:
                    time.sleep(config.pause_s)

            run = score_resumably(payload["requests"], lambda reqs, _: score_requests(engine, tokenizer, reqs, settings),
                                  chunks, scoring_salt(model="tiny-random-llama-seed-0", config=vars(settings)),
                                  label="fault partition", chunk_documents=CHUNK_DOCUMENTS,
                                  report=dagster_progress(context, "fault partition"), after_chunk=announce)
        table = assemble(payload["rows"], run.long, run.readouts)
        table["features_sha256"] = hashlib.sha256(run.features.tobytes()).hexdigest()
        table["fault_partition"] = PARTITION
        table["generation"] = config.generation
        print("FAULT-STORING", flush=True)
        yield dg.Output(table, metadata=run.progress.metadata())
        if not config.keep_chunks:
            shutil.rmtree(chunks, ignore_errors=True)

    return dg.Definitions(assets=[fault_scores], resources={"io_manager": store_io_manager(path=str(db), store="duckdb")})


def materialize(job, db, chunks, generation: str = "new", keep_chunks: bool = False) -> dg.ExecuteInProcessResult:
    defs = build_defs(job, db, chunks)
    return dg.materialize(defs.assets, resources=defs.resources, partition_key=PARTITION,
                          run_config={"ops": {"fault_scores": {"config": {"generation": generation,
                                                                           "keep_chunks": keep_chunks}}}})


def _die_inside_the_store_transaction() -> None:
    from fear_assets.defs.resources import store

    original = store.EmptyAwarePandasTypeHandler.handle_output

    def handle_output(self, context, table_slice, obj, connection):
        result = original(self, context, table_slice, obj, connection)
        print("FAULT-INSIDE-TRANSACTION", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    store.EmptyAwarePandasTypeHandler.handle_output = handle_output


def main(argv: list[str]) -> int:
    job, db, chunks, generation = argv[:4]
    if "--die-in-store" in argv:
        _die_inside_the_store_transaction()
    result = materialize(job, db, chunks, generation)
    print("FAULT-DONE" if result.success else "FAULT-FAILED", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
