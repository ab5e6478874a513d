"""A code location for the run-monitoring fault test (issue 27): ``fault_scoring.fault_scores``
in pool "gpu", its job file, store and chunk directory named by the environment
(``FEAR_FAULT_JOB``, ``FEAR_FAULT_DB``, ``FEAR_FAULT_CHUNKS``), so that the daemon's code
server and the run workers it launches score the same partition. The in-process executor:
the run worker is the scoring process (no step subprocess to start, which would double each
run's start-up on a small CI host); the test kills the worker and any children it has."""

import os

import dagster as dg

from fear_assets_tests.fault_scoring import build_defs


def _in_process() -> dg.Definitions:
    scoring = build_defs(os.environ["FEAR_FAULT_JOB"], os.environ["FEAR_FAULT_DB"], os.environ["FEAR_FAULT_CHUNKS"],
                         pool="gpu")
    return dg.Definitions(assets=scoring.assets, resources=scoring.resources, executor=dg.in_process_executor)


defs = _in_process()
