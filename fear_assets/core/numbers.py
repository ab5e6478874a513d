"""How every number a researcher reads is written: one function, precision by quantity.

Gate tables, check metadata, the estimands table, the forest plot's labels and the Stage 2
report all format through :func:`number`, so one quantity reads the same everywhere (a
posterior mean is never ``0.04`` in one place and ``0.0400`` in another; an ESS is a whole
number; a missing value reads ``n/a``, never ``nan``; a flag reads ``yes``/``no``, never
``True``/``False``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
import pandas as pd

Quantity = Literal["value", "estimate", "probability", "rate", "count", "ess", "rhat", "p", "kappa", "percent", "seconds"]

#: Decimals by quantity (fixed, so a column's numbers line up and compare at a glance).
DECIMALS: Mapping[str, int] = {"value": 3, "estimate": 3, "probability": 3, "rate": 3, "rhat": 3, "p": 3, "kappa": 2,
                               "percent": 1, "seconds": 1}
MISSING = "n/a"
#: Beyond these magnitudes a fixed-decimal number stops being readable (an R-hat of 14,462,920).
_HUGE, _TINY = 1e5, 1e-3


def is_missing(x: object) -> bool:
    """None, NaN or pandas' NA/NaT."""
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):  # a list or array is not one missing value
        return False


def yes_no(flag: object) -> str:
    """A flag as a reader says it."""
    return MISSING if is_missing(flag) else ("yes" if bool(flag) else "no")


def passed_failed(flag: object) -> str:
    """A gate's or check's outcome as a word."""
    return MISSING if is_missing(flag) else ("passed" if bool(flag) else "failed")


def _exponent(x: float) -> str:
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def number(x: object, quantity: Quantity = "estimate") -> str:
    """``x`` written for a reader: counts and effective sample sizes as whole numbers with
    thousands separators; p-values below 0.001 as ``<0.001``; percentages with one decimal
    and a ``%``; everything else with the quantity's fixed decimals, in exponent form when
    it is huge (or, for a plain ``value``, tiny: a tolerance of 1.2e-4 is not 0.000); ``n/a``
    when missing; flags as yes/no; text unchanged. Estimates keep fixed decimals however
    small, so an interval's two ends and a column's rows share one form ([-0.153, -0.000],
    never [-0.153, -1.7e-4])."""
    if is_missing(x):
        return MISSING
    if isinstance(x, (bool, np.bool_)):
        return yes_no(x)
    try:
        value = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(x)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if quantity in ("count", "ess"):
        return f"{round(value):,}"
    if quantity == "p" and 0 <= value < _TINY:
        return "<0.001"
    if quantity == "percent":
        return f"{value * 100:.{DECIMALS['percent']}f}%"
    if value != 0 and (abs(value) >= _HUGE or (quantity == "value" and abs(value) < _TINY)):
        return _exponent(value)
    return f"{value:.{DECIMALS[quantity]}f}"


def interval(low: object, high: object, quantity: Quantity = "estimate") -> str:
    """An interval as ``[low, high]``."""
    return f"[{number(low, quantity)}, {number(high, quantity)}]"


def formatted(table: pd.DataFrame, quantities: Mapping[str, Quantity] | None = None) -> pd.DataFrame:
    """``table`` with every cell written by :func:`number` (a column's quantity from
    ``quantities``, else a plain value; integer columns as counts), as text ready for a
    Markdown, HTML or Dagster table."""
    quantities = quantities or {}
    out = {}
    for column in table.columns:
        series = table[column]
        quantity = quantities.get(column, "count" if pd.api.types.is_integer_dtype(series.dtype)
                                  and not pd.api.types.is_bool_dtype(series.dtype) else "value")
        out[column] = [number(x, quantity) for x in series]
    return pd.DataFrame(out, index=table.index, columns=table.columns)


def markdown_table(table: pd.DataFrame, quantities: Mapping[str, Quantity] | None = None) -> str:
    """A Markdown table of :func:`formatted` cells (no index; text kept as written)."""
    return formatted(table, quantities).to_markdown(index=False, disable_numparse=True)
