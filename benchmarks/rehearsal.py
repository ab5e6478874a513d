"""The registered-shape rehearsal, measured: ``fear rehearse`` of one or more families on this
machine, and from its token counts the projected GPU time of the whole family at its
registered 10 confirmatory frames per fear (50 frames), every block.

For each family this runs the rehearsal (or, with ``--read``, reads the workspace a previous
one left), then writes ``results/rehearsal.json``: per step (asset x partition) the wall
time and peak resident memory; per scoring table, block and depth the documents, tokens and
context exclusions; the exclusions by cell; the store's size. The projection gives each
scored document the per-document cost ``benchmarks/gpu.py`` measured on one H200 at its
length (``results/gpu.json``: prefill + packed branch pass + its share of batched decoding,
log-log interpolated, as ``family_projection.py`` does) and scales each confirmatory block's
documents by registered frames / rehearsal frames; pilot blocks are the registered ones.

    nice .venv/bin/python benchmarks/rehearsal.py qwen2.5-7b --frames 1 --depths 0,256
    nice .venv/bin/python benchmarks/rehearsal.py gemma-2-9b --read   # re-read a finished workspace
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu import interpolate  # noqa: E402

from fear_assets.core.settings import REGISTERED_SETTINGS_PATH, load_settings  # noqa: E402
from fear_assets.design.trials import build_grid  # noqa: E402
from fear_assets.rehearsal.run import RESULT, figures as figures_of, rehearse, workspace_name  # noqa: E402
from fear_assets.rehearsal.workspace import DEFAULT_ROOT, Rehearsal, thinning_of  # noqa: E402
from fear_assets.stimuli.bank import load_bank  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "rehearsal.json"


def projected_hours(figures: dict, gpu: dict, registered_frames: int) -> dict:
    """GPU hours of the family's registered run from the rehearsal's scored documents (see the
    module docstring): by stage (pilot, collection) and in all."""
    per_document = document_cost(gpu)
    scale = registered_frames / figures["frames_per_fear"]
    out = {"pilot": 0.0, "collection": 0.0, "documents_pilot": 0, "documents_collection": 0}
    for r in figures["scored_by_block"]:
        stage = "collection" if r["table"] == "confirmatory_scores" else "pilot"
        n = r["documents"] * (scale if stage == "collection" else 1.0)
        out[stage] += n * per_document(float(r["mean_tokens"] or 0)) / 3600
        out[f"documents_{stage}"] += round(n)
    return {"pilot_hours": round(out["pilot"], 2), "collection_hours": round(out["collection"], 2),
            "hours": round(out["pilot"] + out["collection"], 2),
            "documents": out["documents_pilot"] + out["documents_collection"],
            "documents_pilot": out["documents_pilot"], "documents_collection": out["documents_collection"],
            "confirmatory_scale": scale}


def document_cost(gpu: dict):
    """Seconds per document of ``tokens`` on the measured GPU (see the module docstring)."""
    rows, batch, max_new = gpu["lengths"], gpu["generation_batch"], gpu["projection"]["max_new_tokens"]

    def per_document(tokens: float) -> float:
        tokens = max(tokens, rows[0]["tokens"])  # below the shortest measured length: its cost (an upper bound)
        return (interpolate([(r["tokens"], r["prefill_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["packed_pass_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["decode_step_s"]) for r in rows], tokens) * max_new / batch)
    return per_document


def projected_whole_family(figures: dict, settings, bank, family: str, gpu: dict) -> dict:
    """GPU hours of the family's whole registered design: every block, every registered depth,
    the registered frames (10 per fear), pilot included. The documents are the registered trial
    grid's (``build_grid`` on the registered settings); each is priced at its depth's distractor
    tokens plus its block's own tokens as the rehearsal measured them (mean ``n_tokens`` minus
    the depth's distractor tokens, averaged over the rehearsed depths), so a rehearsal of two
    depths projects all eight. An upper bound: documents the context window excludes are priced
    as scored, and pilot control blocks as if run at every depth (they run at the band's)."""
    per_document = document_cost(gpu)
    spec = settings.family(family)
    tokens_of = dict(zip(spec.depth_keys, spec.depth_tokens))
    rehearsed = figures.get("depth_tokens") or []
    keys = {f"d{i}": t for i, t in enumerate(rehearsed, start=1)}  # the rehearsal's own depth keys
    own: dict[str, list[float]] = {}
    for r in figures["scored_by_block"]:
        if r["mean_tokens"] is not None and r["depth"] in keys:
            own.setdefault(r["block"], []).append(float(r["mean_tokens"]) - keys[r["depth"]])
    overall = sum(sum(v) for v in own.values()) / max(1, sum(len(v) for v in own.values()))
    grid = build_grid(settings, bank, family)
    counts = grid.groupby(["block", "depth"]).size()
    by_depth: dict[str, dict] = {}
    hours = {"pilot": 0.0, "collection": 0.0}
    pilot_blocks = {b.name for b in settings.blocks if b.is_pilot}
    for (block, depth), n in counts.items():
        extra = sum(own[block]) / len(own[block]) if block in own else overall
        tokens = tokens_of[depth] + extra
        h = int(n) * per_document(tokens) / 3600
        stage = "pilot" if block in pilot_blocks else "collection"
        hours[stage] += h
        d = by_depth.setdefault(depth, {"depth_tokens": tokens_of[depth], "documents": 0, "hours": 0.0})
        d["documents"] += int(n)
        d["hours"] += h
    return {"documents": int(counts.sum()), "pilot_hours": round(hours["pilot"], 2),
            "collection_hours": round(hours["collection"], 2), "hours": round(sum(hours.values()), 2),
            "by_depth": {k: {**v, "hours": round(v["hours"], 2)} for k, v in by_depth.items()},
            "block_tokens_measured": len(own), "block_tokens_mean": round(overall, 1)}


def summary(figures: dict) -> dict:
    """The headline figures of one rehearsal: wall time, the slowest steps, peak memory, store size."""
    steps = sorted(figures["steps"], key=lambda s: -s["seconds"])
    return {"wall_seconds": figures["wall_seconds"], "steps": len(steps),
            "slowest_steps": [{k: s[k] for k in ("stage", "assets", "partition", "seconds", "peak_rss_mib")}
                              for s in steps[:8]],
            "peak_rss_mib": max((s["peak_rss_mib"] or 0) for s in steps) if steps else None,
            "store_mib": round(figures["store_bytes"] / 2 ** 20, 1),
            "documents_scored": int(sum(r["documents"] for r in figures["scored_by_block"])),
            "tokens_scored": int(sum(r["tokens"] or 0 for r in figures["scored_by_block"])),
            "excluded_context": int(sum(r["excluded"] or 0 for r in figures["scored_by_block"])),
            "verified": figures.get("verified"), "returncodes": figures["returncodes"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("families", nargs="+")
    p.add_argument("--frames", type=int, default=1)
    p.add_argument("--depths", default=None, help="comma-separated depth tokens (default: every registered depth)")
    p.add_argument("--read", action="store_true", help="read the finished workspaces instead of running them")
    p.add_argument("--dir", default=None, help="the workspace (one family; default data/rehearsal/<family>-f<N>...)")
    p.add_argument("--pilot-frames", type=int, default=None, help="fear rehearse's thinning (a quick rehearsal)")
    p.add_argument("--rotations", default=None, help="fear rehearse's thinning (a quick rehearsal)")
    p.add_argument("--events", type=int, default=None, help="fear rehearse's thinning (a quick rehearsal)")
    p.add_argument("--quick-fits", action="store_true", help="fear rehearse's thinning (a quick rehearsal)")
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")] if args.depths else None
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    bank = load_bank(settings=settings)
    thinning = thinning_of(args.pilot_frames, args.rotations, args.events, settings, args.quick_fits)
    lo, hi = settings.bank.frame_sets["confirmatory"]
    gpu = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())["gpu"]
    source = {"source": f"benchmarks/results/gpu.json ({gpu['device']}, {gpu['date']})"}
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rehearsals": {}}
    for family in args.families:
        root = Path(args.dir) if args.dir else DEFAULT_ROOT / workspace_name(family, args.frames, depths, thinning)
        if args.read:  # the workspace's figures, re-read with this code (a rehearsal stopped early included)
            done = json.loads((root / RESULT).read_text())
            rehearsal = Rehearsal(family, args.frames, tuple(depths) if depths else None, root.resolve(),
                                  thinning=thinning)
            figures = {**figures_of(rehearsal, done["wall_seconds"], done["returncodes"]),
                       **({"verified": done["verified"]} if "verified" in done else {})}
        else:
            _, figures = rehearse(family, args.frames, depths, root, thinning=thinning)
        key = workspace_name(family, args.frames, depths, thinning)
        out["rehearsals"][key] = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end",
            "command": f"benchmarks/rehearsal.py {family} --frames {args.frames}"
                       + (f" --depths {args.depths}" if args.depths else "")
                       + (f" --pilot-frames {args.pilot_frames}" if args.pilot_frames else "")
                       + (f" --rotations {args.rotations}" if args.rotations else "")
                       + (f" --events {args.events}" if args.events else "")
                       + (" --quick-fits" if args.quick_fits else ""),
            "family": family, "frames_per_fear": args.frames, "depth_tokens": figures["depth_tokens"],
            "reduction": figures["reduction"], **summary(figures),
            # The rehearsed depths' documents scaled to the registered frames (meaningless when thinned).
            **({} if thinning else {"projected_h200_at_registered_frames":
                                    projected_hours(figures, gpu, hi - lo + 1) | source}),
            "projected_h200_whole_family": projected_whole_family(figures, settings, bank, family, gpu) | source,
            "scored_by_block": figures["scored_by_block"], "exclusions_by_cell": figures["exclusions_by_cell"],
            "steps": figures["steps"],
        }
        s = out["rehearsals"][key]
        print(f"{key}: {s['wall_seconds']:.0f} s on this machine, {s['documents_scored']:,} documents, "
              f"{s['tokens_scored']:,} tokens, peak {s['peak_rss_mib']} MiB, store {s['store_mib']} MiB; "
              f"projected {s['projected_h200_whole_family']['hours']} h on one H200 for the whole registered family "
              f"(every block and depth, 10 frames per fear)")
    RESULTS.write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
