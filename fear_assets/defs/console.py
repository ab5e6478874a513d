"""What the console entry points share before their heavy imports: library warnings held
for the run log (PyTensor's BLAS notice, ArviZ's RuntimeWarnings on degenerate draws go to
the log beside the store, not through the console summary)."""

from __future__ import annotations

import logging
import logging.handlers
import warnings

#: Captured warnings wait here until the command knows where its log goes (``main.prepare``).
WARNINGS = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)


def capture_warnings() -> None:
    """Send library warnings to ``WARNINGS``; an entry point calls it before importing Dagster."""
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").addHandler(WARNINGS)
    logging.getLogger("py.warnings").propagate = False
    warnings.simplefilter("default")
