"""The same code location with Dagster's Kubernetes executor (one GPU per GPU step).

Use on a cluster with GPU nodes, with ``dagster-k8s`` installed in the image, by pointing
the workspace at this module instead of ``fear_assets.definitions``:

    load_from:
      - python_file: deploy/kubernetes/definitions_k8s.py

Every asset in pool "gpu" (sentence_surprisal, scores) carries ``dagster-k8s/config`` tags
asking for ``nvidia.com/gpu: 1`` (fear_assets/deploy.py); a backfill of one family over
all depths then runs one pod per partition. Model weights must already be on the nodes
(a read-only volume mounted at HF_HOME or at the checkpoint paths of the settings): the
loaders never download. The DuckDB file must live on a shared volume (FEAR_ASSETS_DUCKDB);
DuckDB admits one writer at a time, which pool "duckdb" and the IO manager's retry respect.
"""

import dagster as dg
from dagster_k8s import k8s_job_executor

from fear_assets.definitions import all_assets, all_checks, jobs, resources

executor = k8s_job_executor.configured({
    "job_namespace": {"env": "DAGSTER_K8S_NAMESPACE"},
    "max_concurrent": 16,  # at most this many pods at once per run
    "env_vars": ["FEAR_ASSETS_DUCKDB", "HF_HOME", "DAGSTER_HOME"],
    "volume_mounts": [{"name": "models", "mount_path": "/models", "read_only": True},
                      {"name": "store", "mount_path": "/store"}],
    "volumes": [{"name": "models", "persistent_volume_claim": {"claim_name": "fear-assets-models"}},
                {"name": "store", "persistent_volume_claim": {"claim_name": "fear-assets-store"}}],
})

defs = dg.Definitions(assets=all_assets, asset_checks=all_checks, jobs=jobs, resources=resources(),
                      executor=executor)
