"""``fear rehearse FAMILY [--frames N] [--depths T,...]``: a registered family's whole protocol at
its registered shape on random-weight stand-ins, pilot to Stage 2 report, through the
product's own commands.

1. The stand-in checkpoints (``rehearsal.models.build_family``: each registered architecture
   at a tiny size with the family's registered tokenizer and chat format), built once into
   the cache.
2. The workspace (``rehearsal.workspace.prepare_workspace``): the rehearsal's settings
   (confirmatory frames per fear reduced to N, the only reduction besides ``--depths`` and a
   reduced power simulation, said in every output), their freeze record, a site file that
   places the stand-ins as a lab places real weights, an instance and a store of its own.
3. ``fear run FAMILY --through registration`` (pilot mode: gates advisory), ``fear register``
   (a rehearsal's record is issued despite failed gates and says it is a rehearsal), then
   ``fear run FAMILY`` in confirmatory mode: collection, probes, analysis, reading, Stage 2
   report and data record.
4. The figures (``rehearsal.json`` in the workspace): every step's wall time and peak memory
   (the stage loop's ``$FEAR_STEP_LOG``), and per table and partition the documents, tokens,
   context exclusions by cell and the store's size.

A rerun resumes (the stage loop keeps what an earlier run finished from the same inputs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import duckdb
import pandas as pd
import yaml

from fear_assets.core.settings import DEFAULT_CACHE_DIR, REGISTERED_SETTINGS_PATH, load_settings
from fear_assets.rehearsal.models import build_family
from fear_assets.rehearsal.workspace import (DEFAULT_ROOT, Rehearsal, RehearsalError, Thinning, prepare_workspace,
                                             rehearsal_settings, thinning_of)
from fear_assets.registration.issue import CONFIRMATORY, family_mode

STEP_LOG = "steps.jsonl"
RESULT = "rehearsal.json"
SCHEMA = "two_facts_one_gate"
#: The tables of scored documents (one row per document and reader).
SCORING_TABLES = ("pilot_scores", "pilot_control_scores", "confirmatory_scores")
#: The stand-in checkpoints live here, built once and shared by every rehearsal.
MODELS_DIRNAME = "rehearsal_models"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fear rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("family", metavar="FAMILY", help="a registered family (not the embedded demo)")
    p.add_argument("--frames", type=int, default=1, help="confirmatory frames per fear (default 1)")
    p.add_argument("--depths", default=None,
                   help="comma-separated depths in tokens to keep (default: every registered depth)")
    p.add_argument("--dir", default=None, help=f"the workspace (default {DEFAULT_ROOT}/<family>-f<N>[-d...])")
    p.add_argument("--through", default=None, help="the last stage (default: every stage, to the Stage 2 report)")
    p.add_argument("--device", default="cpu", help="the device of the stand-ins (site configuration; default cpu)")
    quick = p.add_argument_group("a small rehearsal (the test suite's): thinned beyond the registered shape, "
                                 "said in every output")
    quick.add_argument("--pilot-frames", type=int, default=None, metavar="N",
                       help="the lowest-numbered N pilot frames of each fear (default: the registered pilot set)")
    quick.add_argument("--rotations", default=None, metavar="R,...",
                       help="the name rotations built at every depth (default: every registered rotation)")
    quick.add_argument("--events", type=int, default=None, metavar="N",
                       help="secondary-class events per class (default: the registered number)")
    quick.add_argument("--quick-fits", action="store_true",
                       help="every fit on the reduced power simulation's short sampler, without the convergence "
                            "remedy's extensions (default: the registered sampler and remedy)")
    return p


def workspace_name(family: str, frames: int, depths: Sequence[int] | None, thinning: Thinning = Thinning()) -> str:
    return (f"{family}-f{frames}" + (f"-d{'-'.join(map(str, depths))}" if depths else "")
            + ("-thinned" if thinning.thins_design else "")
            + ("-quickfits" if thinning.quick_fits else ""))


def fear(rehearsal: Rehearsal, *argv: str, log: Path) -> int:
    """One ``fear`` command in the rehearsal's environment; its output goes to the console and ``log``."""
    env = {**rehearsal.environment(), "FEAR_STEP_LOG": str(rehearsal.root / STEP_LOG)}
    print(f"$ fear {' '.join(argv)}", flush=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ fear {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen([sys.executable, "-m", "fear_assets.defs.cli", *argv], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
        return proc.wait()


def table_figures(duckdb_path: Path, family: str) -> pd.DataFrame:
    """Per table and partition (depth where the table has one): rows (documents for a scoring
    table), tokens (sum of ``n_tokens``) and context exclusions."""
    if not duckdb_path.exists():
        return pd.DataFrame(columns=["table", "depth", "rows", "tokens", "excluded_context"])
    rows = []
    with duckdb.connect(str(duckdb_path), read_only=True) as con:
        tables = [r[0] for r in con.execute(
            "select table_name from duckdb_tables() where schema_name = ? order by 1", [SCHEMA]).fetchall()]
        for table in tables:
            cols = {r[0] for r in con.execute(f'describe {SCHEMA}."{table}"').fetchall()}
            if "family" not in cols:
                continue
            depth = "depth" if "depth" in cols else "'-'"
            tokens = "sum(n_tokens)" if "n_tokens" in cols else "null"
            excluded = "sum(case when excluded_context then 1 else 0 end)" if "excluded_context" in cols else "null"
            for d, n, t, x in con.execute(
                    f'select {depth}, count(*), {tokens}, {excluded} from {SCHEMA}."{table}" where family = ? '
                    f'group by 1 order by 1', [family]).fetchall():
                rows.append({"table": table, "depth": str(d), "rows": int(n),
                             "tokens": None if t is None else int(t), "excluded_context": None if x is None else int(x)})
    return pd.DataFrame(rows)


def per_scoring_table(duckdb_path: Path, family: str, select: str, keys: int) -> pd.DataFrame:
    """``select ... from <table> where family = ? group by`` the first ``keys`` columns, for
    every scoring table the store holds, with a ``table`` column (empty where none is stored)."""
    out = []
    if not duckdb_path.exists():
        return pd.DataFrame()
    groups = ", ".join(str(i) for i in range(1, keys + 1))
    with duckdb.connect(str(duckdb_path), read_only=True) as con:
        for table in SCORING_TABLES:
            try:
                frame = con.execute(f"select {select} from {SCHEMA}.{table} where family = ? "
                                    f"group by {groups} order by {groups}", [family]).df()
            except duckdb.CatalogException:  # the table was never materialised
                continue
            out.append(frame.assign(table=table))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


EXCLUDED = "sum(case when excluded_context then 1 else 0 end) as excluded"


def scored_by_block(duckdb_path: Path, family: str) -> pd.DataFrame:
    """Documents, tokens (sum and mean of ``n_tokens``) and context exclusions of every scoring
    table by block and depth: what a projection of the registered run's GPU time needs."""
    return per_scoring_table(duckdb_path, family, "block, depth, count(*) as documents, sum(n_tokens) as tokens, "
                             f"avg(n_tokens) as mean_tokens, max(n_tokens) as max_tokens, {EXCLUDED}", 2)


def exclusions_by_cell(duckdb_path: Path, family: str) -> pd.DataFrame:
    """Context-window exclusions of every scoring table by block, depth and cell (condition code)."""
    return per_scoring_table(duckdb_path, family,
                             f"block, depth, condition_code as cell, count(*) as documents, {EXCLUDED}", 3)


def verified(rehearsal: Rehearsal) -> dict[str, dict]:
    """What a finished rehearsal must show, each a check that can fail: (1) every confirmatory
    block is in the confirmatory trial table and has scored rows in ``confirmatory_scores`` at
    every depth the table builds it at; (2) the analysis fitted the confirmatory rows, not the
    pilot's; (3) the Stage 2 report lists every block and says REHEARSAL."""
    settings = load_settings(rehearsal.settings_path)
    family = rehearsal.family
    out: dict[str, dict] = {}
    with duckdb.connect(str(rehearsal.duckdb_path), read_only=True) as con:
        def rows(sql: str) -> pd.DataFrame:
            try:
                return con.execute(sql, [family]).df()
            except duckdb.CatalogException:  # not materialised
                return pd.DataFrame()
        # What the design built (block x depth of the confirmatory trial table) against what was scored.
        built = rows(f"select distinct block, depth from {SCHEMA}.confirmatory_trial_table where family = ?")
        scored = rows(f"select distinct block, depth from {SCHEMA}.confirmatory_scores where family = ?")
        frames = rows(f"select distinct frame_set from {SCHEMA}.posteriors where family = ?")
    confirmatory = {b.name for b in settings.blocks if not b.is_pilot}
    want = {(b, d) for b, d in built.itertuples(index=False, name=None)} if len(built) else set()
    have = {(b, d) for b, d in scored.itertuples(index=False, name=None)} if len(scored) else set()
    missing = sorted(want - have)
    unbuilt = sorted(confirmatory - {b for b, _ in want})
    out["every confirmatory block scored"] = {
        "passed": bool(want) and not missing and not unbuilt,
        "detail": f"{len({b for b, _ in want & have})} of {len(confirmatory)} blocks scored at "
                  f"{len(want & have)} of {len(want)} (block, depth) pairs"
                  + (f"; not scored: {', '.join(f'{b} {d}' for b, d in missing)}" if missing else "")
                  + (f"; not in the design: {', '.join(unbuilt)}" if unbuilt else "")}
    sets = sorted(frames["frame_set"]) if len(frames) else []
    out["analysis fitted confirmatory rows"] = {"passed": sets == ["confirmatory"],
                                                "detail": f"posteriors' frame sets: {', '.join(sets) or 'none'}"}
    report = rehearsal.root / "reports" / family / "stage2_report.html"
    text = report.read_text(encoding="utf-8") if report.exists() else ""
    absent = [b.name for b in settings.blocks if f">{b.name}<" not in text]
    out["the Stage 2 report lists every block"] = {
        "passed": bool(text) and not absent and "REHEARSAL" in text,
        "detail": (f"{report}: " + (f"missing {', '.join(absent)}" if absent else "every block listed")
                   + ("" if "REHEARSAL" in text else "; does not say REHEARSAL")) if text else f"{report} not written"}
    return out


def figures(rehearsal: Rehearsal, seconds: float, returncodes: dict[str, int]) -> dict:
    """The rehearsal's measured figures (``rehearsal.json``)."""
    steps_path = rehearsal.root / STEP_LOG
    steps = [json.loads(line) for line in steps_path.read_text().splitlines()] if steps_path.exists() else []
    tables = table_figures(rehearsal.duckdb_path, rehearsal.family)
    cells = exclusions_by_cell(rehearsal.duckdb_path, rehearsal.family)
    settings = load_settings(rehearsal.settings_path)
    return {
        "family": rehearsal.family, "frames_per_fear": rehearsal.frames,
        "depth_tokens": list(settings.family(rehearsal.family).depth_tokens),
        "reduction": settings.family(rehearsal.family).reduced_design.reason,
        "mode": family_mode(rehearsal.registration_dir, rehearsal.family),
        "wall_seconds": round(seconds, 1), "returncodes": returncodes,
        "store_bytes": rehearsal.duckdb_path.stat().st_size if rehearsal.duckdb_path.exists() else 0,
        "workspace_bytes": sum(p.stat().st_size for p in rehearsal.root.rglob("*") if p.is_file() and not p.is_symlink()),
        "steps": steps,
        "tables": tables.to_dict(orient="records"),
        "scored_by_block": scored_by_block(rehearsal.duckdb_path, rehearsal.family).to_dict(orient="records"),
        "exclusions_by_cell": cells.to_dict(orient="records"),
    }


def rehearse(family: str, frames: int = 1, depths: Sequence[int] | None = None, root: Path | None = None,
             through: str | None = None, device: str = "cpu", thinning: Thinning = Thinning()) -> tuple[int, dict]:
    """Run the rehearsal (see the module docstring); returns (exit status, figures).
    ``thinning``: a small rehearsal's thinned pilot, rotations and events (default none)."""
    registered_settings = load_settings(REGISTERED_SETTINGS_PATH)
    root = Path(root) if root is not None else DEFAULT_ROOT / workspace_name(family, frames, depths, thinning)
    # A CPU emulates bfloat16 (5x slower measured on the stand-ins): they compute in float32 there.
    rehearsal = Rehearsal(family, frames, tuple(depths) if depths else None, root.resolve(),
                          "float32" if device == "cpu" else None, thinning)
    started = time.perf_counter()
    # The arguments first (an unknown family or depth, the embedded demo), before any build.
    rehearsal_settings(yaml.safe_load(REGISTERED_SETTINGS_PATH.read_text(encoding="utf-8")), family, frames, depths,
                       thinning=thinning)
    directories = build_family(registered_settings, family, DEFAULT_CACHE_DIR / MODELS_DIRNAME)
    prepare_workspace(rehearsal, REGISTERED_SETTINGS_PATH, directories, device=device)
    log = rehearsal.root / "rehearsal.log"
    codes: dict[str, int] = {}
    stop_after_pilot = through in ("stimuli", "pilot", "registration")
    codes["pilot"] = fear(rehearsal, "run", family, "--through", through if stop_after_pilot else "registration",
                          log=log)
    if codes["pilot"] == 0 and not stop_after_pilot:
        if family_mode(rehearsal.registration_dir, family) != CONFIRMATORY:
            codes["register"] = fear(rehearsal, "register", family, "--stage1-id", f"REHEARSAL-{family}",
                                     "--supplementary-note", str(rehearsal.note_path), log=log)
        if codes.get("register", 0) == 0:
            codes["confirmatory"] = fear(rehearsal, "run", family, *(["--through", through] if through else []), log=log)
    out = figures(rehearsal, time.perf_counter() - started, codes)
    if codes.get("confirmatory") == 0 and not through:
        out["verified"] = verified(rehearsal)
        for name, check in out["verified"].items():
            print(f"  {'ok  ' if check['passed'] else 'FAIL'} {name}: {check['detail']}")
        if not all(c["passed"] for c in out["verified"].values()):
            codes["verified"] = 1
    (rehearsal.root / RESULT).write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    status = max(codes.values()) if codes else 1
    print(f"\nrehearsal of {family}: {'finished' if status == 0 else 'STOPPED'} in {out['wall_seconds']:.0f} s; "
          f"figures: {rehearsal.root / RESULT}")
    return status, out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",")] if args.depths else None
    except ValueError:
        print(f"fear rehearse: --depths {args.depths!r}: write token counts separated by commas (e.g. 0,256)",
              file=sys.stderr)
        return 2
    try:
        thinning = thinning_of(args.pilot_frames, args.rotations, args.events, quick_fits=args.quick_fits)
        status, _ = rehearse(args.family, args.frames, depths, Path(args.dir) if args.dir else None, args.through,
                             args.device, thinning)
    except RehearsalError as exc:
        print(f"fear rehearse: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
