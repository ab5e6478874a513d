"""The same code location on a cluster: Dagster's Kubernetes executor and the multi-writer store.

Use on a cluster with GPU nodes, with ``dagster-k8s`` installed in the image (``pip install
.[k8s]``), deployed with Dagster's official Helm chart and ``deploy/kubernetes/values.yaml``,
whose user-code deployment serves this file (``dagster api grpc --python-file ...``).

- Every step runs in its own pod (``k8s_job_executor``). Every asset in pool "gpu"
  (``sentence_surprisal``, ``scores``, ...) carries ``dagster-k8s/config`` tags asking for
  ``nvidia.com/gpu: 1`` (``fear_assets/defs/deploy.py``); the pool's limit (``dagster instance
  concurrency set gpu N``) keeps at most N of them running, one per GPU.
- Tables go to the multi-writer store (``store: parquet``, one atomically replaced Parquet file
  per partition) under ``FEAR_ASSETS_PARQUET_ROOT`` on a ReadWriteMany volume: many pods write
  partitions at once with no file lock. Raise pool "duckdb" (``dagster instance concurrency set
  duckdb 16``): on this store it no longer guards a single-writer file.
- Model weights are on a read-only volume mounted at /models (``HF_HOME=/models/hf`` or local
  checkpoint paths in the settings): the loaders never download.
- The instance (run, event and schedule storage) is Postgres: the Helm chart writes it from
  ``values.yaml``; ``deploy/dagster.postgres.yaml`` is the same instance outside Kubernetes.
"""

import dagster as dg
from dagster_k8s import k8s_job_executor

from fear_assets.defs.definitions import all_assets, all_checks, jobs, resources
from fear_assets.defs.resources.store import store_io_manager

MODELS_CLAIM = "fear-assets-models"  # read-only: weights placed there beforehand
STORE_CLAIM = "fear-assets-store"  # ReadWriteMany: the Parquet store

executor = k8s_job_executor.configured({
    "max_concurrent": 16,  # at most this many step pods at once per run (pools limit across runs)
    "env_vars": ["FEAR_ASSETS_STORE", "FEAR_ASSETS_PARQUET_ROOT", "HF_HOME", "DAGSTER_HOME"],
    "volume_mounts": [{"name": "models", "mount_path": "/models", "read_only": True},
                      {"name": "store", "mount_path": "/store"}],
    "volumes": [{"name": "models", "persistent_volume_claim": {"claim_name": MODELS_CLAIM, "read_only": True}},
                {"name": "store", "persistent_volume_claim": {"claim_name": STORE_CLAIM}}],
})

cluster_resources = {**resources(), "io_manager": store_io_manager(store="parquet")}

defs = dg.Definitions(assets=all_assets, asset_checks=all_checks, jobs=jobs, resources=cluster_resources,
                      executor=executor)
