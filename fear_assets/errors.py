"""Errors that name the file, the item, the field and the fix (scikit-learn style)."""

from __future__ import annotations

from pathlib import Path


class FearAssetsError(ValueError):
    """Base class: every message says where the problem is and what to change."""


class InputError(FearAssetsError):
    """A registered input file (settings or bank) is malformed.

    The message always carries ``file``, ``item`` (id or key path), ``field`` and ``fix``,
    so a researcher can correct the file without reading code.
    """

    def __init__(self, file: str | Path, item: str, field: str, problem: str, fix: str):
        self.file = str(file)
        self.item = item
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(
            f"{self.file}: item {item!r}, field {field!r}: {problem}. Fix: {fix}"
        )


class SettingsError(InputError):
    """The registered protocol settings file is malformed."""


class BankError(InputError):
    """The stimulus bank is malformed."""


class DesignError(FearAssetsError):
    """A design cannot be built for this configuration (e.g. too few frames)."""


class FreezeError(FearAssetsError):
    """Inputs differ from the frozen registration record."""
