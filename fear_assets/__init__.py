"""fear_assets: the registered protocol "Two Facts, One Gate" as Dagster software-defined assets."""

__version__ = "0.1.0"

from fear_assets.models.decision import label
from fear_assets.reading.decision import section8_reading  # noqa: E402  (the public decision API)

__all__ = ["label", "section8_reading", "__version__"]
