"""Deployment tags (not registered science): how GPU steps ask for a GPU on Kubernetes.

The tags are inert under the default single-machine executor; under dagster-k8s's
``k8s_job_executor`` (see ``deploy/kubernetes/``) each GPU step runs in its own pod with
one GPU, so a backfill of family x depth partitions spreads across GPU hosts.
"""

GPU_OP_TAGS = {
    "dagster-k8s/config": {
        "container_config": {
            "resources": {
                "limits": {"nvidia.com/gpu": "1", "memory": "80Gi"},
                "requests": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"},
            },
        },
        "pod_spec_config": {"node_selector": {"nvidia.com/gpu.present": "true"}},
    },
}
