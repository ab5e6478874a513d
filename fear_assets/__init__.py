"""fear_assets: the registered protocol "Two Facts, One Gate" as Dagster software-defined assets."""

__version__ = "0.1.0"
