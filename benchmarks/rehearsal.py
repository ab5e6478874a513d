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
from fear_assets.rehearsal.run import RESULT, figures as figures_of, rehearse, workspace_name  # noqa: E402
from fear_assets.rehearsal.workspace import DEFAULT_ROOT, Rehearsal  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "rehearsal.json"


def projected_hours(figures: dict, gpu: dict, registered_frames: int) -> dict:
    """GPU hours of the family's registered run from the rehearsal's scored documents (see the
    module docstring): by stage (pilot, collection) and in all."""
    rows, batch, max_new = gpu["lengths"], gpu["generation_batch"], gpu["projection"]["max_new_tokens"]

    def per_document(tokens: float) -> float:
        tokens = max(tokens, rows[0]["tokens"])  # below the shortest measured length: its cost (an upper bound)
        return (interpolate([(r["tokens"], r["prefill_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["packed_pass_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["decode_step_s"]) for r in rows], tokens) * max_new / batch)

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
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")] if args.depths else None
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    lo, hi = settings.bank.frame_sets["confirmatory"]
    gpu = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())["gpu"]
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rehearsals": {}}
    for family in args.families:
        root = Path(args.dir) if args.dir else DEFAULT_ROOT / workspace_name(family, args.frames, depths)
        if args.read:  # the workspace's figures, re-read with this code (a rehearsal stopped early included)
            done = json.loads((root / RESULT).read_text())
            rehearsal = Rehearsal(family, args.frames, tuple(depths) if depths else None, root.resolve())
            figures = {**figures_of(rehearsal, done["wall_seconds"], done["returncodes"]),
                       **({"verified": done["verified"]} if "verified" in done else {})}
        else:
            _, figures = rehearse(family, args.frames, depths, root)
        key = workspace_name(family, args.frames, depths)
        out["rehearsals"][key] = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end",
            "command": f"benchmarks/rehearsal.py {family} --frames {args.frames}"
                       + (f" --depths {args.depths}" if args.depths else ""),
            "family": family, "frames_per_fear": args.frames, "depth_tokens": figures["depth_tokens"],
            "reduction": figures["reduction"], **summary(figures),
            "projected_h200_at_registered_frames": projected_hours(figures, gpu, hi - lo + 1)
            | {"source": f"benchmarks/results/gpu.json ({gpu['device']}, {gpu['date']})"},
            "scored_by_block": figures["scored_by_block"], "exclusions_by_cell": figures["exclusions_by_cell"],
            "steps": figures["steps"],
        }
        s = out["rehearsals"][key]
        print(f"{key}: {s['wall_seconds']:.0f} s on this machine, {s['documents_scored']:,} documents, "
              f"{s['tokens_scored']:,} tokens, peak {s['peak_rss_mib']} MiB, store {s['store_mib']} MiB; "
              f"projected {s['projected_h200_at_registered_frames']['hours']} h on one H200 at the registered frames "
              f"(these depths)")
    RESULTS.write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
