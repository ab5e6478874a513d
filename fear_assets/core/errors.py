"""Errors that name the file, the item, the field and the fix (scikit-learn style)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


# --- The load boundary (issue 16: fuzzed input never gives a traceback) -----------------------

#: What malformed data raises inside a validator that did not foresee it (a key missing, a
#: value of another type, an empty list indexed): converted at the load boundary.
SHAPE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError, ZeroDivisionError, OverflowError,
                RecursionError)


def _where(exc: BaseException, default_file: str | Path) -> tuple[str, str, str]:
    """(file, item, code line) of the innermost validator frame that names the file it reads."""
    import traceback

    file, item, line = str(default_file), "<the check below names it>", ""
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        local = tb.tb_frame.f_locals
        candidate = local.get("path") or local.get("source_file")
        if isinstance(candidate, (str, Path)) and str(candidate).endswith((".yaml", ".yml")):
            file = str(candidate)
            it = local.get("it") or local.get("item")
            item = str(getattr(it, "id", None) or local.get("item_id") or item)
            break
    summary = traceback.extract_tb(exc.__traceback__)[-1]
    line = f"{Path(summary.filename).name}:{summary.lineno} `{(summary.line or '').strip()}`"
    return file, item, line


@contextmanager
def input_boundary(error: type[InputError], path: str | Path, fix: str) -> Iterator[None]:
    """Re-raise any shape error of a validator as ``error`` naming the file, item, field and fix."""
    try:
        yield
    except FearAssetsError:
        raise
    except SHAPE_ERRORS as exc:
        file, item, line = _where(exc, path)
        field = repr(exc.args[0]) if isinstance(exc, KeyError) and exc.args else "<value of the wrong shape>"
        problem = (f"a missing key {field}" if isinstance(exc, KeyError) else
                   f"a value of the wrong type or shape ({type(exc).__name__}: {str(exc)[:200]})")
        raise error(file, item, field.strip("'"), f"{problem}; found while checking {line}", fix) from exc
