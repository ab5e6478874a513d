"""Every simulated model of the power gate on an accelerator (issue 28, items 1, 3(a) and 5), for a
machine WITHOUT PyMC: one export of every block's registered model here, one run on the device.

    # here (PyMC, nutpie): every block's log density, K datasets, the nutpie references of V
    nice -n 10 .venv/bin/python benchmarks/power_gpu_blocks.py export --frames 50 --depths 8 \\
        --datasets 32 --validate-datasets 4 --validate-blocks primary
    # here, if the folder is over what a lease carries (64 MiB with the tree): fewer blocks or datasets
    .venv/bin/python benchmarks/power_gpu_blocks.py subset --out .gpu_lease --blocks primary probe \\
        --datasets 32 --whole primary
    # on the device (numpy, scipy, jax, blackjax; the package's pure validation module)
    python benchmarks/power_gpu_blocks.py run --platform cuda --max-seconds 300

``export`` draws K datasets of the registered design (``simulate_blocks``: every block of a
dataset from its own seed under the registered master seed; the pilot estimates of
``power_gpu.py validate``), and per block (``blocks.REPORTED``) writes a folder under
``.gpu_power_blocks/``: the block's registered model (``accelerated.block_program``, the frame form
the registered rule picks for dataset 0; datasets of another form are left out and counted) as a
``jax.export`` of its batched log density and gradient, checked against PyMC's compiled
``logp``/``dlogp`` within 1e-8 (a primary-model block's other frame form too, for the candidate's
refit: ``OTHER_FORM_FILE``); the outcomes (float32, and float64 for the validation datasets);
the kept coordinates (``accelerated.kept_indices``), the block metric's dense coordinates
(``accelerated.dense_block_indices``) and the reported contrasts as an affine map of the kept
vector (``accelerated.affine_contrasts``, checked against the analysis functions). For the first
V datasets of each block in ``--validate-blocks`` it runs the registered sampler's long reference
(nutpie, 4 x (1,000 + R), run again at a higher target acceptance while it misses the
convergence rule: ``power_gpu.converged_reference``) and stores its contrast draws, divergences
and attempts.

``run`` fits every block's K datasets x chains in one program per block with the candidate
sampler (``vectorised.BatchedAdaptiveHMC``, every dataset's own warm-up; ``--algorithm
adaptive_hmc_dense``: the block mass matrix), runs the registered convergence remedy (up to the
registered number of extensions while a dataset misses the rule) and then the candidate's own (a
dataset still divergent is fitted again in the other frame form: ``other_form_refit``, as
``accelerated.fit_block`` does), and reports per block: compile
and run seconds, seconds and gradients per dataset, datasets per hour, divergences, the datasets
missing the convergence rule on any reported contrast (counted, never dropped: D7), and, where
the export holds references, item 3(a)'s comparison (``validation.compare_runs``: MCSE units,
labels) with the reference's own convergence beside it. Every block's seconds per dataset summed
give the simulation's seconds per dataset (every model the reading needs). The JSON
(``$OUT/power_gpu_blocks.json``, else ``benchmarks/results/``) is rewritten after every block, so
a killed run keeps what it measured and names the block and phase it was in (``in_progress``); a
block whose projected time would pass ``--max-seconds`` is skipped and named, an extension round
that would pass it is not started, and with ``--chunk-draws N`` the draws after the warm-up run in
chunks of N (the same frozen kernels continued), so a fit stops between chunks at the deadline with
its draws kept. One program for the warm-up and draws together cannot be stopped: a lease's
timeout inside it loses the block.

``rescore`` scores saved draws again against an export's references; ``verdict`` joins one
``rescore`` per registered scenario into the record a host's ``power_sampler.validation`` names
(passed only where every scenario passed on 64 datasets, fitted by one sampler).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import power_gpu as pg  # noqa: E402  (numpy and the standard library only at import)

ART = ROOT / ".gpu_power_blocks"
#: A primary-model block's log density in the frame form the rule did not pick: the candidate's
#: remedy refits there a dataset still divergent after its extensions (``accelerated.fit_block``).
OTHER_FORM_FILE = "logdensity.other_form.jaxexport.gz"
#: What the device may not import (it has none of them): the check of the device run.
HEAVY = ("pymc", "pytensor", "arviz", "dagster", "duckdb", "pandas", "xarray", "nutpie")


# -- export (needs PyMC and nutpie) -------------------------------------------------------------
def export(args) -> int:
    sys.path.insert(0, str(ROOT))
    from fear_assets.core.settings import load_settings
    from fear_assets.models.h5_model import H5Priors
    from fear_assets.models.primary_model import Priors
    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation.blocks import REPORTED, outcome, simulate_blocks
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.runner import Rules

    t0 = time.perf_counter()
    settings = load_settings()
    rules, priors, h5p = Rules.from_settings(settings), Priors.from_settings(settings), H5Priors.from_settings(settings)
    rule, seed = settings.fitting.frame_parametrisation, settings.master_seed
    blocks = tuple(args.blocks or REPORTED)
    unknown = [b for b in (*blocks, *args.validate_blocks) if b not in REPORTED]
    if unknown:
        raise SystemExit(f"--blocks/--validate-blocks: unknown block(s) {unknown}; use those of {list(REPORTED)}")
    keys = [f"d{i}" for i in range(1, args.depths + 1)]
    design = simulated_design(settings, keys, keys[-2:] if args.depths >= 2 else keys, args.frames, (0.2, 0.2), seed=1)
    est = pg._validation_estimates()
    # every block the reading needs (the joint fits draw the primary block's cells with it)
    drawn = tuple(dict.fromkeys(("primary", *blocks)))
    sims = [simulate_blocks(design, est, rules, "device", args.scenario, i, seed, drawn, priors.fixed_sd)
            for i in range(args.datasets)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    conv = settings.convergence
    summary = {}
    for block in blocks:
        t = time.perf_counter()
        forms = [acc.frame_form(x[block], rule) for x in sims]
        idx = [k for k in range(len(sims)) if forms[k] == forms[0]]
        b0 = sims[idx[0]][block]
        Y = np.stack([outcome(sims[k][block]) for k in idx])
        d = out / block
        d.mkdir(exist_ok=True)
        prog = acc.block_program(b0, priors, h5p, rule=rule)
        jm = prog.jm
        one = exported_form(prog, Y[0], d / pg.EXPORT_FILE, args.check_points, seed, block)
        arrays = {"x0": jm.x0, **one.pop("arrays"),
                  "Y": Y.astype(np.float32), "Y_validate": Y[:0].astype(np.float64),
                  "reference_divergences": np.zeros(0, dtype=np.int64)}
        contrasts = one["contrasts"]
        # the references are added below, by the code `references` runs (cached, resumable)
        arrays.update({f"reference_{name}": np.zeros((0, 4, args.reference_draws)) for name in contrasts})
        other = None
        if forms[0] is not None:  # a primary-model block: the other form, for the candidate's refit
            other_prog = acc.block_program(b0, priors, h5p, rule=rule, form=acc.other_form(forms[0]))
            other = exported_form(other_prog, Y[0], d / OTHER_FORM_FILE, args.check_points, seed, block)
            arrays.update({f"other_{k}": v for k, v in other.pop("arrays").items()}, other_x0=other_prog.jm.x0)
            other = {"form": acc.other_form(forms[0]), "dim": other_prog.jm.dim, "names": list(other_prog.jm.names),
                     "sizes": list(map(int, other_prog.jm.sizes)), **other}
        np.savez_compressed(d / "arrays.npz", **arrays)
        manifest = {"block": block, "kind": b0.kind, "frame_form": forms[0], "rows": int(Y.shape[1]), "dim": jm.dim,
                    "names": list(jm.names), "sizes": list(map(int, jm.sizes)), "kept": list(prog.kept),
                    "datasets": idx, "datasets_of_another_form": len(sims) - len(idx), "contrasts": contrasts,
                    "ropes": {name: float(rules.sesoi) if b0.rope is None else float(b0.rope) for name in contrasts},
                    "validate_datasets": 0, "reference": None,
                    "check_vs_pymc": one["check_vs_pymc"], "export_sha256": one["export_sha256"], "other_form": other,
                    "export_s": time.perf_counter() - t}
        (d / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        summary[block] = {k: manifest[k] for k in ("kind", "frame_form", "rows", "dim", "validate_datasets", "export_s")}
        print(f"[{time.perf_counter() - t0:.0f} s] {block}: {json.dumps(summary[block])}", flush=True)
    s = settings.simulation_sampler
    top = {"what": "every simulated block's registered model exported for the device; benchmarks/power_gpu_blocks.py",
           "frames": args.frames, "depths": args.depths, "rows_primary": design.rows, "datasets": args.datasets,
           "scenario": args.scenario, "blocks": list(blocks), "master_seed": seed, "settings_sha256": settings.sha256,
           "dataset_seeds": "blocks.dataset_seed(master_seed, 'device', scenario, frames, i, block), i = 0..K-1",
           "simulation_sampler": dict(vars(s)), "extension_draws": s.extension_draws,
           "max_extensions": settings.fitting.convergence_remedy.max_extensions,
           "convergence": {"rhat_max": conv.rhat_max, "ess_bulk_min": conv.ess_bulk_min,
                           "ess_tail_min": conv.ess_tail_min, "divergences_max": conv.divergences_max},
           "hdi_prob": settings.decision.hdi_prob, "platforms": ["cpu", "cuda"],
           "jax_export_version": __import__("jax").__version__, "per_block": summary}
    (out / "manifest.json").write_text(json.dumps(top, indent=1) + "\n")
    for block in blocks:
        if block in args.validate_blocks and args.validate_datasets:
            same_form = len(json.loads((out / block / "manifest.json").read_text())["datasets"])
            add_references(out, block, min(args.validate_datasets, same_form), args.reference_draws,
                           args.reference_cache, t0)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported blocks={len(blocks)} frames={args.frames} depths={args.depths} datasets={args.datasets} "
          f"bytes={size} total_s={time.perf_counter() - t0:.0f} out={out}")
    return 0


def exported_form(prog, y, path: Path, check_points: int, seed: int, block: str) -> dict:
    """One form of a block's program written to ``path`` (a gzipped ``jax.export`` of its batched
    log density and gradient, checked against PyMC's within 1e-8 at ``check_points`` points about
    its initial point, outcome ``y``) with what a device run reads of it: ``arrays`` (kept and
    dense coordinates, the contrasts' affine map), ``contrasts``, the check and the export's hash."""
    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation.vectorised import check_export, export_logdensity

    jm = prog.jm
    blob = export_logdensity(jm.logdensity, jm.dim, len(y), platforms=("cpu", "cuda"))
    points = jm.x0 + np.random.default_rng(seed).normal(0.0, 0.3, (check_points, jm.dim))
    check = check_export(prog.model, jm, blob, y, points)
    if max(check["logp_rel"], check["dlogp_rel"]) > 1e-8:
        raise RuntimeError(f"block {block} ({path.name}): exported log density differs from PyMC's: {check}")
    W, c, contrasts = acc.affine_contrasts(prog)
    # gzip: the design's constants (indices, covariates) in the module compress ~9x
    path.write_bytes(gzip.compress(blob, compresslevel=6, mtime=0))
    return {"arrays": {"keep_idx": acc.kept_indices(prog), "dense_idx": acc.dense_block_indices(jm.names, jm.sizes),
                       "contrast_W": W, "contrast_c": c},
            "contrasts": contrasts, "check_vs_pymc": {"points": check_points, "max_diff": check},
            "export_sha256": hashlib.sha256(blob).hexdigest()}


# -- references and the null check (need PyMC and nutpie) ----------------------------------------
class Exported:
    """One block of an export with what drew its datasets (the export's manifest, the current
    settings): ``dataset(j)`` draws its j-th dataset again and checks it equals the exported one."""

    def __init__(self, artefacts: Path, block: str):
        sys.path.insert(0, str(ROOT))
        from fear_assets.core.settings import load_settings
        from fear_assets.models.h5_model import H5Priors
        from fear_assets.models.primary_model import Priors
        from fear_assets.simulation.design import simulated_design
        from fear_assets.simulation.runner import Rules

        self.art, self.block = Path(artefacts), block
        self.top = json.loads((self.art / "manifest.json").read_text())
        self.dir = self.art / block
        if not (self.dir / "manifest.json").exists():
            raise SystemExit(f"--block {block}: no {self.dir}/manifest.json; exported blocks: {self.top['blocks']}")
        self.m = json.loads((self.dir / "manifest.json").read_text())
        self.arr = dict(np.load(self.dir / "arrays.npz"))
        self.settings = settings = load_settings()
        if settings.sha256 != self.top["settings_sha256"]:
            raise SystemExit(f"{self.art}/manifest.json: settings_sha256 {self.top['settings_sha256'][:12]} is not the "
                             f"current settings' {settings.sha256[:12]}: the datasets would differ; export again")
        self.rules, self.priors = Rules.from_settings(settings), Priors.from_settings(settings)
        self.h5p = H5Priors.from_settings(settings)
        self.rule, self.seed = settings.fitting.frame_parametrisation, settings.master_seed
        keys = [f"d{i}" for i in range(1, self.top["depths"] + 1)]
        self.design = simulated_design(settings, keys, keys[-2:] if self.top["depths"] >= 2 else keys,
                                       self.top["frames"], (0.2, 0.2), seed=1)
        self.est = pg._validation_estimates()

    def dataset(self, j: int):
        from fear_assets.simulation import accelerated as acc
        from fear_assets.simulation.blocks import outcome, simulate_blocks

        k = self.m["datasets"][j]
        drawn = tuple(dict.fromkeys(("primary", self.block)))
        b = simulate_blocks(self.design, self.est, self.rules, "device", self.top["scenario"], k, self.seed, drawn,
                            self.priors.fixed_sd)[self.block]
        if acc.frame_form(b, self.rule) != self.m["frame_form"] or not np.array_equal(
                outcome(b).astype(np.float32), self.arr["Y"][j]):
            raise SystemExit(f"{self.dir}/arrays.npz: dataset {k} drawn again differs from the exported one (the code "
                             f"that draws datasets changed since the export): export again")
        return b


def references(args) -> int:
    """More nutpie references for one block of an existing export, up to ``--datasets``: item
    3(a) asks for at least 64 datasets per scenario, and a registered-size reference runs for
    minutes, so this runs in many sittings (``add_references``)."""
    add_references(Path(args.artefacts), args.block, int(args.datasets), args.reference_draws,
                   args.reference_cache, time.perf_counter())
    return 0


def add_references(art: Path, block: str, n: int, reference_draws: int, cache, t0: float) -> None:
    """Nutpie references of ``block``'s first ``n`` datasets (``export``'s, then ``references``'
    more): the datasets are drawn again from the export's manifest (their seeds depend only on
    it) and must equal the exported outcomes; each attempt is kept in ``cache`` and
    ``arrays.npz`` is rewritten (whole, then renamed) after every dataset, so a stopped run
    loses at most the dataset it was fitting."""
    from fear_assets.models.primary_model import Fitter
    from fear_assets.simulation.blocks import outcome

    ex = Exported(art, block)
    m, arr, d = ex.m, ex.arr, ex.dir
    V0 = int(m["validate_datasets"])
    if n > len(m["datasets"]):
        raise SystemExit(f"--datasets {n}: the export holds {len(m['datasets'])} datasets of block {block}")
    if V0 and m["reference"]["draws"] != reference_draws:
        raise SystemExit(f"--reference-draws {reference_draws}: the export's references have "
                         f"{m['reference']['draws']}; give that")
    ref_fitter = Fitter(ex.priors, reference_draws, 1000, 4, rule=ex.rule)
    attempts = list((m["reference"] or {}).get("attempts", []))
    print(f"[{time.perf_counter() - t0:.0f} s] {block}: {V0} references, extending to {n}", flush=True)
    for j in range(V0, n):
        k = m["datasets"][j]
        b = ex.dataset(j)
        draws, divergent, tried = pg.converged_reference(
            b, ref_fitter, ex.priors, ex.h5p, reference_draws, ex.seed + 7 + k, ex.settings.convergence,
            cache=cache,
            log=lambda msg, k=k: print(f"[{time.perf_counter() - t0:.0f} s] dataset {k}: {msg}", flush=True))
        arr["Y_validate"] = np.concatenate([arr["Y_validate"][:j], outcome(b)[None].astype(np.float64)])
        arr["reference_divergences"] = np.append(arr["reference_divergences"][:j], divergent).astype(np.int64)
        for name in m["contrasts"]:
            x = np.asarray(draws[name], dtype=np.float64).reshape(1, 4, reference_draws)
            arr[f"reference_{name}"] = np.concatenate([arr[f"reference_{name}"][:j], x]) if j else x
        attempts.append(tried)
        m["validate_datasets"] = j + 1
        m["reference"] = {"sampler": "nutpie, the registered model (Fitter, the registered frame rule)", "chains": 4,
                          "tune": 1000, "draws": reference_draws, "attempts": attempts}
        tmp = d / "arrays.tmp.npz"
        np.savez_compressed(tmp, **arr)
        os.replace(tmp, d / "arrays.npz")
        (d / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
        print(f"[{time.perf_counter() - t0:.0f} s] {block}: reference {j + 1} of {n} kept", flush=True)
    ex.top["per_block"][block]["validate_datasets"] = int(m["validate_datasets"])
    (ex.art / "manifest.json").write_text(json.dumps(ex.top, indent=1) + "\n")
    print(f"references block={block} validate_datasets={m['validate_datasets']} "
          f"total_s={time.perf_counter() - t0:.0f}")


def null(args) -> int:
    """The comparison's false-alarm check: the registered sampler (nutpie) itself, run again at the
    candidate's length (4 chains x ``--draws`` after 1,000 tuning steps) with new seeds, against the
    export's references, scored by ``validation.compare_runs``. Both runs are correct, so every z is
    about N(0, 1): the JSON gives the SD and largest |z| per statistic and whether the rule passed,
    and each contrast's shared shifts (``compare_runs``' ``shared_shift_z``): a candidate's shared
    shift that the registered sampler shows too against the same references is the comparison's,
    not the candidate's. ``--first-dataset`` and ``--run-offset`` (the runs' seeds) let it run in
    sittings, or add runs new to an earlier check.
    Beside it, the endpoints' z with a quantile's MCSE at the endpoint's share (the estimator before
    2026-12-05), to show what the bootstrap changes. The short runs' draws are kept beside the
    JSON (``.draws.npz``); ``--reuse-draws`` scores them again without sampling."""
    from hdi_mcse_null import quantile_mcse_z

    from fear_assets.models.primary_model import Fitter
    from fear_assets.simulation import diagnostics as dg
    from fear_assets.simulation import validation

    t0 = time.perf_counter()
    ex = Exported(Path(args.artefacts), args.block)
    m, arr = ex.m, ex.arr
    V = min(int(m["validate_datasets"]), args.datasets or int(m["validate_datasets"]))
    F, R0 = int(args.first_dataset), int(args.run_offset)
    if not V:
        raise SystemExit(f"{ex.dir}: no references; run `references` first")
    if not 0 <= F < V or R0 < 0:
        raise SystemExit(f"--first-dataset {F} --run-offset {R0}: give 0 <= first dataset < {V} (the datasets with "
                         f"a reference) and a run offset >= 0")
    fitter = Fitter(ex.priors, args.draws, 1000, 4, rule=ex.rule)
    hdi_prob = ex.top["hdi_prob"]
    rows, quantile_z, divergences = [], [], []
    kept_path = Path(args.json).with_suffix(".draws.npz")
    if args.reuse_draws:  # score the kept runs again: no sampling
        kept = dict(np.load(kept_path))
        if kept[m["contrasts"][0]].shape[:2] != (V - F, args.runs):
            raise SystemExit(f"{kept_path}: holds another number of datasets or runs than --first-dataset/--datasets/"
                             f"--runs")
    else:
        kept = {c: np.zeros((V - F, args.runs, 4, args.draws)) for c in m["contrasts"]}
        kept["divergences"] = np.zeros((V - F, args.runs), dtype=np.int64)
    for i, j in enumerate(range(F, V)):
        b = None if args.reuse_draws else ex.dataset(j)
        long = {name: arr[f"reference_{name}"][j] for name in m["contrasts"]}
        # run r's seeds are the same whatever --runs says, so `--run-offset 2` gives runs new to `--runs 2`
        for r in range(R0, R0 + args.runs):
            if not args.reuse_draws:
                idata = fitter.fit(b.data, ex.seed + 5000 + 100 * r + m["datasets"][j])
                for c, x in b.contrasts(idata).items():
                    kept[c][i, r - R0] = np.asarray(x).reshape(4, -1)
                kept["divergences"][i, r - R0] = int(np.asarray(idata.sample_stats["diverging"]).sum())
            short = {c: kept[c][i, r - R0] for c in m["contrasts"]}
            divergences.append(int(kept["divergences"][i, r - R0]))
            comp = validation.compare_runs({c: [short[c]] for c in m["contrasts"]},
                                           {c: [long[c]] for c in m["contrasts"]}, hdi_prob, m["ropes"],
                                           ex.seed + r)
            for row in comp["rows"]:
                rows.append({**row, "dataset": m["datasets"][j], "run": r})
                quantile_z.extend(quantile_mcse_z(short[row["contrast"]], long[row["contrast"]], hdi_prob))
            print(f"[{time.perf_counter() - t0:.0f} s] dataset {m['datasets'][j]} run {r}: max |z| "
                  f"{comp['max_z']:.2f}, divergences {divergences[-1]}", flush=True)
    if not args.reuse_draws:
        np.savez_compressed(kept_path, **kept)
    z = {st: np.array([row[f"z_{st}"] for row in rows]) for st in dg.STATISTICS}
    allz = np.concatenate(list(z.values()))
    bound = validation.z_bound(allz.size)
    res = {"what": "nutpie against nutpie: the validation rule's false alarms; benchmarks/power_gpu_blocks.py null",
           "block": args.block, "datasets": V - F, "dataset_numbers": [int(k) for k in m["datasets"][F:V]],
           "runs": list(range(R0, R0 + args.runs)), "runs_per_dataset": args.runs,
           "short": {"chains": 4, "tune": 1000, "draws": args.draws},
           "reference_draws": m["reference"]["draws"], "scenario": ex.top["scenario"],
           "reference_sha256": {str(m["datasets"][j]): reference_fingerprint(arr, m["contrasts"], j)
                                for j in range(F, V)},
           "comparisons": int(allz.size), "z_bound": bound,
           "sd_z": {st: float(v.std()) for st, v in z.items()},
           "mean_z": {st: float(v.mean()) for st, v in z.items()},
           # as compare_runs reports a candidate's: the scale on which its shared shifts are read
           "shared_shift_z": validation.shared_shifts(rows),
           "max_abs_z": {st: float(np.abs(v).max()) for st, v in z.items()},
           "share_abs_z_over_3": {st: float(np.mean(np.abs(v) > 3)) for st, v in z.items()},
           "passed": bool(np.abs(allz).max() <= bound),
           "label_flips": int(sum(row["flip"] for row in rows)),
           "label_flips_not_near_boundary": int(sum(row["flip"] and not row["near_boundary"] for row in rows)),
           "quantile_mcse_endpoints": {"sd_z": float(np.std(quantile_z)), "max_abs_z": float(np.abs(quantile_z).max()),
                                       "share_abs_z_over_3": float(np.mean(np.abs(quantile_z) > 3))},
           "short_divergences": divergences, "rows": rows, "seconds": time.perf_counter() - t0,
           "load": os.getloadavg()}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"null block={args.block} comparisons={res['comparisons']} sd_z_endpoints="
          f"{res['sd_z']['hdi_low']:.2f},{res['sd_z']['hdi_high']:.2f} max_z={np.abs(allz).max():.2f} "
          f"bound={bound:.2f} passed={res['passed']} quantile_mcse_sd_z={res['quantile_mcse_endpoints']['sd_z']:.2f} "
          f"json={out}")
    return 0


# -- subset (here): what a lease can carry ---------------------------------------------------
def subset(args) -> int:
    """A copy of an export with only ``--blocks``, each cut to its first ``--datasets`` datasets
    (blocks named in ``--whole`` keep all of theirs): a lease carries at most 64 MiB with the tree,
    and a registered-size export of 64 datasets is about 50 MB. The validation datasets and the
    log densities are copied unchanged; the references too, unless ``--without-references``
    (about two thirds of a registered-size primary block: the device then fits every kept dataset
    exactly as its reference sees it, made or still to be made, ``float64_outcomes``, and
    ``rescore`` with the whole export scores its saved draws here, so three scenarios' blocks fit
    in one lease)."""
    src, out = Path(args.artefacts), Path(args.out)
    top = json.loads((src / "manifest.json").read_text())
    unknown = [b for b in (*args.blocks, *args.whole) if b not in top["blocks"]]
    if unknown:
        raise SystemExit(f"--blocks/--whole: {unknown} not in {src}/manifest.json's blocks {top['blocks']}")
    if out.resolve() == src.resolve():
        raise SystemExit("--out must be another folder than --artefacts")
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(top, indent=1) + "\n")
    for block in args.blocks:
        if block in args.whole:
            shutil.copytree(src / block, out / block, dirs_exist_ok=True)
            continue
        (out / block).mkdir(exist_ok=True)
        for name in (pg.EXPORT_FILE, OTHER_FORM_FILE):
            if (src / block / name).exists():  # an export made before the other form was kept has none
                shutil.copyfile(src / block / name, out / block / name)
        m = json.loads((src / block / "manifest.json").read_text())
        arr = dict(np.load(src / block / "arrays.npz"))
        k = max(args.datasets, m["validate_datasets"])  # never fewer than the references compare
        arr["Y"], m["datasets"] = arr["Y"][:k], m["datasets"][:k]
        if args.without_references:
            arr = {name: x for name, x in arr.items() if not name.startswith("reference_")}
            m["references_left_in"] = str(src)
            arr["Y_validate"] = float64_outcomes(src, block, arr["Y_validate"], k)
        np.savez_compressed(out / block / "arrays.npz", **arr)
        (out / block / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"subset blocks={len(args.blocks)} bytes={size} out={out}")
    return 0


def float64_outcomes(art: Path, block: str, have: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` datasets' outcomes in float64, as their references fit them: ``have`` (the
    datasets with a reference) and the others drawn again from the export's manifest (checked equal
    to the exported float32 ones). So a lease, or a run here, fits a scenario whose references are
    still running exactly as they will see it, and ``rescore`` scores its draws against them later."""
    if len(have) >= k:
        return have
    ex = Exported(art, block)
    from fear_assets.simulation.blocks import outcome  # Exported puts the project on the path

    return np.concatenate([have, *(outcome(ex.dataset(j))[None].astype(np.float64) for j in range(len(have), k))])


# -- run (device: numpy, scipy, jax, blackjax) -------------------------------------------------
def scored(h: dict, failing, arr: dict, m: dict, top: dict, numbers, sbc: dict | None = None) -> dict:
    """Item 3(a) on the datasets of a block numbered ``numbers`` (their positions in the export,
    one per dataset of ``h``) that have a reference: the candidate's contrast draws ``h`` (name ->
    (K, chains, draws)) against the export's references (``validation.compare_runs``), the
    references' own convergence, and the verdict with ``sbc`` (``sbc_of``: item 3(b), run by
    ``power_gpu.py validate`` on a reduced design; None: not given, so at best "incomplete").
    ``failing``: per dataset, whether the candidate missed the rule."""
    from fear_assets.simulation import validation

    rule = argparse.Namespace(**top["convergence"])
    numbers = np.asarray(numbers, dtype=np.int64)
    have = np.flatnonzero(numbers < int(m["validate_datasets"]))  # rows of h with a reference
    ref = numbers[have]
    long = {name: arr[f"reference_{name}"][ref] for name in m["contrasts"]}
    comp = validation.compare_runs({n: [x[i] for i in have] for n, x in h.items()}, long, top["hdi_prob"],
                                   m["ropes"], top["master_seed"], datasets=ref.tolist())
    ref_conv = validation.convergence_counts(long, rule, arr["reference_divergences"][ref])
    verdict = validation.verdict(comp["passed"], int(np.asarray(failing)[have].sum()),
                                 ref_conv["datasets_failing_any"], None if sbc is None else sbc["passed"])
    # the attempts of the compared datasets only: `references` may have added more since the run
    reference = {**m["reference"], "attempts": [m["reference"]["attempts"][k] for k in ref]}
    return {**{k: v for k, v in comp.items() if k != "rows"}, "datasets": len(ref),
            "dataset_numbers": ref.tolist(), "reference": reference, "reference_convergence": ref_conv,
            "sbc": sbc, "verdict": verdict, "rows": comp["rows"]}


#: The sampler settings an SBC must share with the runs whose comparison it completes.
SBC_VOUCHED_FIELDS = ("algorithm", "chains", "warmup", "draws", "target_accept")
#: Item 3(a): "on at least 64 datasets per scenario"; a verdict on fewer is said to be short of it.
DATASETS_PER_SCENARIO = 64


def saved_runs(folders, block: str, contrasts) -> tuple[dict, np.ndarray, np.ndarray, dict | None] | None:
    """One block's saved draws (``run --save-draws``) from several runs of disjoint datasets (a
    CPU fits a validation's datasets in turn): the contrast draws, the failing flags, the
    datasets' numbers in the export (in the order of the numbers) and the runs' sampler settings
    (None where a run saved none: saved before they were recorded); None where no run saved the
    block. A dataset saved twice, or runs of different samplers, is an error (which would count?)."""
    from fear_assets.simulation import validation  # the caller put the project on the path

    parts = []
    for folder in folders:
        path = Path(folder) / f"{block}.npz"
        if path.exists():
            d = dict(np.load(path))
            first = int(d.get("first_dataset", 0))  # runs saved before --first-dataset started at 0
            parts.append((path, d, np.arange(first, first + len(d["failing"]))))
    if not parts:
        return None
    numbers = np.concatenate([n for _, _, n in parts])
    twice = sorted({int(k) for k in numbers if (numbers == k).sum() > 1})
    if twice:
        raise SystemExit(f"--draws: datasets {twice} of block {block} are in more than one of "
                         f"{[str(p) for p, _, _ in parts]}; give each dataset's run once")
    samplers = [json.loads(str(d["sampler"])) if "sampler" in d else None for _, d, _ in parts]
    if any(x is None for x in samplers):
        sampler = None
    else:
        sampler = samplers[0]
        differ = validation.samplers_differing([str(p) for p, _, _ in parts], samplers, SBC_VOUCHED_FIELDS)
        if differ:
            raise SystemExit(f"--draws: runs of block {block} with other samplers than {parts[0][0]}'s "
                             f"({sampler}): {differ}; score each sampler's runs on their own")
    order = np.argsort(numbers, kind="stable")
    # each dataset's draws, without the padding of a run whose extended datasets have more (runs differ in length)
    h: dict = {n: [] for n in contrasts}
    for _, d, _ in parts:
        lengths = d.get("draws_per_dataset", np.full(len(d["failing"]), d[contrasts[0]].shape[2]))
        for n in contrasts:
            h[n] += [x[:, :L] for x, L in zip(d[n], lengths)]
    h = {n: [x[i] for i in order] for n, x in h.items()}
    failing = np.concatenate([np.asarray(d["failing"], dtype=bool) for _, d, _ in parts])[order]
    return h, failing, numbers[order], sampler


def sbc_of(path: Path, sampler: dict | None, top: dict) -> dict:
    """Item 3(b) for a registered-size comparison: the SBC of a ``power_gpu.py validate`` JSON
    (the issue runs it on a reduced design), accepted only for the same sampler settings
    (``SBC_VOUCHED_FIELDS``) and the same registered settings as the export, and only complete
    with at least 500 prior draws; otherwise an error naming what differs."""
    rec = json.loads(path.read_text())
    sbc = rec.get("sbc") or {}
    why = []
    if not sbc.get("complete") or int(sbc.get("prior_draws", 0)) < 500:
        why.append(f"its SBC is not complete with at least 500 prior draws ({sbc.get('prior_draws', 0)} ranked)")
    if rec.get("settings_sha256") != top["settings_sha256"]:
        why.append(f"settings_sha256 {str(rec.get('settings_sha256'))[:12]} is not the export's "
                   f"{top['settings_sha256'][:12]} (run validate again with the current settings)")
    if sampler is None:
        why.append("the saved runs record no sampler settings (saved before they were): fit them again")
    else:
        ran = rec.get("sampler") or {}
        why += [f"sampler {k} {ran.get(k)!r}, the runs' {sampler.get(k)!r}" for k in SBC_VOUCHED_FIELDS
                if ran.get(k) != sampler.get(k)]
    if why:
        raise SystemExit(f"--sbc {path}: " + "; ".join(why))
    return {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "design": f"{rec['frames']} frames x {rec['depths']} depths", "prior_draws": int(sbc["prior_draws"]),
            "min_p": float(sbc["min_p"]), "passed": bool(sbc["passed"])}


def rescore(args) -> int:
    """Item 3(a) again on saved draws (``run --save-draws DIR``; several folders: runs of
    disjoint datasets, scored as one validation) against the export's references as they are
    now (more of them after ``references``, or a changed comparison rule): no sampling, no
    device. JSON to ``--json``."""
    sys.path.insert(0, str(ROOT))
    art, folders = Path(args.artefacts), [Path(f) for f in args.draws]
    top = json.loads((art / "manifest.json").read_text())
    res = {"what": "saved runs' draws scored again; benchmarks/power_gpu_blocks.py rescore",
           "draws": [str(f) for f in folders], "blocks": {}}
    blocks = sorted({p.stem for f in folders for p in f.glob("*.npz")})
    for block in blocks:
        m = json.loads((art / block / "manifest.json").read_text())
        arr = dict(np.load(art / block / "arrays.npz"))
        h, failing, numbers, sampler = saved_runs(folders, block, m["contrasts"])
        if not (numbers < int(m["validate_datasets"])).any():
            continue
        sbc = sbc_of(Path(args.sbc), sampler, top) if args.sbc else None
        res["blocks"][block] = v = scored(h, failing, arr, m, top, numbers, sbc)
        v["sampler"] = sampler
        v["max_z_per_dataset"] = [max(abs(r[f"z_{st}"]) for r in v["rows"] if r["dataset"] == k
                                      for st in ("mean", "sd", "hdi_low", "hdi_high")) for k in v["dataset_numbers"]]
        V = v["datasets"]
        v["scenario"], v["datasets_needed"] = top["scenario"], DATASETS_PER_SCENARIO
        v.update({k: top[k] for k in ("settings_sha256", "frames", "depths")})  # what verdict joins must agree on
        v["enough_datasets"] = V >= DATASETS_PER_SCENARIO
        if args.null:
            from fear_assets.simulation import validation

            rows, files = null_rows_of(args.null, block, arr, m)
            v["lean_beyond_null"] = {"null": files, **validation.lean_beyond_null(v["rows"], rows)}
            print(f"{block}: lean beyond the registered sampler's null on {len(v['lean_beyond_null']['datasets'])} "
                  f"datasets, max |z| {v['lean_beyond_null']['max_abs_lean_z']:.2f} (not judged)", flush=True)
        print(f"{block}: {V} datasets of the {top['scenario']} scenario ({DATASETS_PER_SCENARIO} needed), max |z| "
              f"{v['max_z']:.2f} (bound {v['z_bound']:.2f}), per dataset "
              f"{[round(z, 2) for z in v['max_z_per_dataset']]}, label flips {v['label_flips']}, "
              f"{v['verdict']['status']}", flush=True)
    print(f"rescore blocks={len(res['blocks'])} json={written(res, args.json)}")
    return 0


def verdict(args) -> int:
    """Item 3(a) at registered size over every registered scenario (``settings.power.scenarios``):
    one ``rescore`` JSON per scenario, joined (``validation.verdict_across_scenarios``) into the
    record a host's ``power_sampler.validation`` names. ``sampler_path.validation_status`` reads
    its ``sampler`` and ``passed``, so it vouches for exactly the sampler the scenarios were fitted
    with, and only once all of them passed on 64 datasets each. JSON to ``--json``."""
    sys.path.insert(0, str(ROOT))
    from fear_assets.core.settings import load_settings
    from fear_assets.simulation import validation

    records, files = {}, {}
    for f in args.rescored:
        path = Path(f)
        raw = path.read_bytes()  # read once: parsed here, hashed below
        v = (json.loads(raw).get("blocks") or {}).get(args.block)
        if v is None:
            raise SystemExit(f"--rescored {path}: no {args.block} block in it; rescore that block's saved draws")
        lacking = [k for k in ("scenario", "settings_sha256", "frames", "depths", "sampler") if v.get(k) is None]
        if lacking:
            raise SystemExit(f"--rescored {path}: its {args.block} record lacks {lacking} (written before they were "
                             "recorded, or of runs that saved no sampler): run rescore again")
        if v["scenario"] in records:
            raise SystemExit(f"--rescored: scenario {v['scenario']!r} twice ({files[v['scenario']]['file']} and "
                             f"{path}); give each scenario's rescore once")
        records[v["scenario"]] = v
        files[v["scenario"]] = {"file": str(path), "sha256": hashlib.sha256(raw).hexdigest()}
    try:
        out = validation.verdict_across_scenarios(records, load_settings().power.scenarios, DATASETS_PER_SCENARIO,
                                                  SBC_VOUCHED_FIELDS)
    except ValueError as e:
        raise SystemExit(f"--rescored: {e}") from None
    res = {"what": "item 3(a) at registered size over every registered scenario; benchmarks/power_gpu_blocks.py "
                   "verdict (a host's power_sampler.validation may name it)",
           "block": args.block, "sampler": out["sampler"], "passed": out["passed"],
           "verdict": {k: out[k] for k in ("status", "passed", "reasons")},
           "datasets": min((s["datasets"] for s in out["scenarios"].values()), default=0),
           "datasets_needed_per_scenario": DATASETS_PER_SCENARIO, "frames": out["frames"], "depths": out["depths"],
           "settings_sha256": out["settings_sha256"], "scenarios": out["scenarios"], "rescored": files}
    for s, x in out["scenarios"].items():
        print(f"{s}: {x['status']} on {x['datasets']} datasets, max |z| {x['max_z']:.2f} (bound {x['z_bound']:.2f}), "
              f"label flips {x['label_flips']}", flush=True)
    print(f"verdict {out['status']}" + (f" ({'; '.join(out['reasons'])})" if out["reasons"] else "")
          + f" passed={out['passed']} json={written(res, args.json)}")
    return 0


def written(res: dict, path) -> Path:
    """``res`` as JSON at ``path`` (its folder made); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=float) + "\n")
    return path


def reference_fingerprint(arr: dict, contrasts, j: int) -> str:
    """The j-th reference's contrast draws as one sha256: a null check and a candidate compared
    against the same references, checked, not assumed."""
    h = hashlib.sha256()
    for name in contrasts:
        h.update(np.ascontiguousarray(arr[f"reference_{name}"][j], dtype=np.float64).tobytes())
    return h.hexdigest()


def null_rows_of(paths, block: str, arr: dict, m: dict) -> tuple[list[dict], list[str]]:
    """The rows of the null checks ``paths`` (``null`` JSONs) of ``block``, each row's dataset as
    its position in the export (as a candidate's rows are), after checking that every null row
    was scored against the reference the export holds now."""
    rows = []
    for path in paths:
        nr = json.loads(Path(path).read_text())
        if nr.get("block") != block or "reference_sha256" not in nr:
            raise SystemExit(f"--null {path}: not a null check of block {block} that records its references' "
                             f"sha256 (null JSONs before 2026-12-06 do not): run `null` again, or "
                             f"`null --reuse-draws` with its arguments")
        position = {int(k): m["datasets"].index(int(k)) for k in nr["reference_sha256"]}
        for k, sha in nr["reference_sha256"].items():  # each dataset once, not once per row
            if sha != reference_fingerprint(arr, m["contrasts"], position[int(k)]):
                raise SystemExit(f"--null {path}: dataset {k}'s reference is not the one it was scored "
                                 f"against; run `null` again on these references")
        rows += [{**row, "dataset": position[int(row["dataset"])]} for row in nr["rows"]]
    return rows, [str(p) for p in paths]


def spread(args) -> int:
    """Whether the candidate's MCSEs are its run-to-run spread (``validation.run_to_run_spread``):
    the saved draws of two or more runs of the SAME datasets with other sampler seeds (``run
    --seed-offset``; one ``--draws`` folder per run). Item 3(a)'s z against one fixed reference is
    N(0, 1) only where they are. No sampling; JSON to ``--json``, a line per statistic."""
    sys.path.insert(0, str(ROOT))
    from fear_assets.simulation import validation

    art, folders = Path(args.artefacts), [Path(f) for f in args.draws]
    top = json.loads((art / "manifest.json").read_text())
    res = {"what": "run-to-run spread of a sampler's estimates against its MCSE; benchmarks/power_gpu_blocks.py spread",
           "draws": [str(f) for f in folders], "blocks": {}}
    for block in sorted({p.stem for f in folders for p in f.glob("*.npz")}):
        m = json.loads((art / block / "manifest.json").read_text())
        runs = [saved_runs([f], block, m["contrasts"]) for f in folders]
        if any(r is None for r in runs):
            raise SystemExit(f"--draws: block {block} is not saved in every folder; give runs of the same datasets")
        numbers = runs[0][2]
        if any(not np.array_equal(r[2], numbers) for r in runs):
            raise SystemExit(f"--draws: the runs hold other datasets ({[r[2].tolist() for r in runs]}); give runs of "
                             f"the same datasets")
        samplers = [r[3] or {} for r in runs]
        offsets = [int(x.get("seed_offset", 0)) for x in samplers]
        differ = validation.samplers_differing([str(f) for f in folders], samplers, SBC_VOUCHED_FIELDS)
        if differ or len(set(offsets)) < len(offsets):
            raise SystemExit(f"--draws: give runs of one sampler with distinct --seed-offset (offsets {offsets}; "
                             f"other samplers than {folders[0]}'s: {differ})")
        out = validation.run_to_run_spread([r[0] for r in runs], top["hdi_prob"], top["master_seed"], numbers.tolist())
        res["blocks"][block] = {**out, "seed_offsets": offsets, "dataset_numbers": numbers.tolist(),
                                "sampler": samplers[0], "scenario": top["scenario"]}
        for st, v in out["spread_ratio"].items():
            print(f"{block} {st}: spread / MCSE {v['ratio']:.2f} (95% {v['interval'][0]:.2f}-{v['interval'][1]:.2f}, "
                  f"{out['degrees_of_freedom']} df)", flush=True)
    print(f"spread blocks={len(res['blocks'])} json={written(res, args.json)}")
    return 0


def contrasts_of(W: np.ndarray, c: np.ndarray, names):
    """kept draws (K, chains, draws, k) -> the reported contrasts by name, each (K, chains, draws),
    through the export's affine map (``accelerated.affine_contrasts``)."""
    def draws(kept):
        h = kept @ W + c
        return {name: h[..., j] for j, name in enumerate(names)}

    return draws


def other_form_refit(d: Path, m: dict, arr: dict, opts: dict, target_accept: float, chains: int, warmup: int,
                     draws: int, Y: np.ndarray, remedied, rule, top: dict, extensions: int,
                     stop, first_run_s: float, seed: int) -> dict | None:
    """The datasets of ``remedied`` (a block's fit after its extensions) still holding a divergent
    draw, fitted again in the export's other frame form (``OTHER_FORM_FILE``) as the first form was
    (cold start, ``warmup`` + ``draws``, the remedy's extensions), their draws and divergences
    replaced in ``remedied`` and their gradient evaluations added. Seeds: from the run's ``seed``
    + 3 + ``extensions`` (cold start; + 1 the fit, + 2 + r the extensions). None: no dataset diverged
    or the block has no other form; else a record (``refitted``: positions in the run), with
    ``cut_by_deadline`` where ``stop(seconds)`` refused it (projected at ``first_run_s``: lockstep,
    a few datasets cost about what the batch did)."""
    from fear_assets.simulation import validation
    from fear_assets.simulation import vectorised as vec

    diverging = [j for j, dv in enumerate(remedied.divergences) if int(np.sum(dv)) > 0]
    if not diverging or m.get("other_form") is None:
        return None if not diverging else {"refitted": [], "form": None, "datasets_divergent": diverging,
                                           "cut_by_deadline": "the export holds no other frame form (export again)"}
    other = m["other_form"]
    record = {"refitted": [], "form": other["form"], "datasets_divergent": diverging,
              "divergences_before": [int(np.sum(remedied.divergences[j])) for j in diverging], "cut_by_deadline": None}
    why = stop(first_run_s)
    if why:
        record["cut_by_deadline"] = why
        return record
    ld = vec.exported_logdensity(gzip.decompress((d / OTHER_FORM_FILE).read_bytes()))
    sampler = vec.BatchedAdaptiveHMC(ld, other["dim"], arr["other_x0"], arr["other_keep_idx"],
                                     target_accept=target_accept,
                                     dense_idx=arr["other_dense_idx"] if opts["dense"] else None,
                                     shrink_dense=opts["shrink_dense"], pool_length=opts["pool_length"],
                                     min_pooled_chains=opts["min_pooled_chains"])
    base = seed + 3 + extensions
    Yd, tm = Y[diverging], {}
    fit = sampler.fit_kept(Yd, vec.FrozenHMC.cold_start(arr["other_x0"], chains, base), base + 1, warmup, draws,
                           timings=tm)
    again = vec.extend_missing(sampler, Yd, fit,
                               contrasts_of(arr["other_contrast_W"], arr["other_contrast_c"], m["contrasts"]),
                               lambda dr, dv: validation.convergence_counts(dr, rule, dv)["failing"],
                               base + 2, top["extension_draws"], extensions,
                               stop=lambda r: stop(tm["run_s"] * top["extension_draws"] / (warmup + draws)))
    for i, j in enumerate(diverging):
        for name in remedied.draws:
            remedied.draws[name][j] = again.draws[name][i]
        remedied.divergences[j] = again.divergences[i]
        remedied.gradients[j] = np.asarray(remedied.gradients[j]) + np.asarray(again.gradients[i])
    ad = fit["adapted"]
    record.update(refitted=diverging, divergences_after=[int(np.sum(again.divergences[i])) for i in range(len(Yd))],
                  extensions=len(again.extended), datasets_extended=again.extended,
                  extensions_cut_by_deadline=again.stopped, compile_s=tm["compile_s"] + again.compile_s,
                  run_s=tm["run_s"] + again.run_s, warmup_chains=sampler.warmup_chains(len(Yd), chains),
                  step_size=[float(v) for v in ad.step_size],
                  trajectory_length=[float(v) for v in ad.trajectory_length])
    return record


def run_fingerprint(exported: bytes, arrays: dict[str, np.ndarray], **options) -> str:
    """What makes a run's chains its own: the exported log density, the arrays the chains are
    built from (the datasets' outcomes as fitted, the start point, the kept and dense-block
    parameters), and every option that seeds or shapes the chains (not the draws wanted: a
    resumed run may ask for more). A checkpoint is continued only under the same fingerprint."""
    h = hashlib.sha256(exported)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()


def past_deadline(need_s: float, deadline: float) -> str | None:
    """Why a step projected at ``need_s`` seconds is not started (None: it fits before ``deadline``)."""
    left = deadline - time.perf_counter()
    return f"projected {need_s:.0f} s > {left:.0f} s left" if need_s > left else None


#: What ``run`` reads of the registered ``simulation_sampler`` in an export's manifest.
SAMPLER_FIELDS = ("algorithm", "chains", "warmup", "draws", "target_accept", "min_pooled_chains")


def run(args) -> int:
    t_start = time.perf_counter()
    deadline = t_start + args.max_seconds
    jax, devices, backend_init_s = pg.jax_on(args.platform)
    sys.path.insert(0, str(ROOT))
    # the package's pure validation rules (numpy and scipy): the same comparison `validate` makes
    from fear_assets.simulation import validation

    vec = pg._load("vectorised")
    art = Path(args.artefacts)
    if not (art / "manifest.json").is_file():
        raise SystemExit(f"{art}/manifest.json missing: write the folder with `benchmarks/power_gpu_blocks.py export` "
                         f"where PyMC is installed and carry it (--artefacts names another one)")
    top = json.loads((art / "manifest.json").read_text())
    rule = argparse.Namespace(**top["convergence"])
    s = pg.registered_sampler(top, art, SAMPLER_FIELDS, "benchmarks/power_gpu_blocks.py")
    chains = args.chains or s["chains"]
    seed = top["master_seed"] + 100_000 * args.seed_offset  # the sampler's seeds; the scoring's stay the master seed's
    algorithm = args.algorithm or s["algorithm"]
    if algorithm not in pg.ADAPTIVE_CANDIDATES:
        raise SystemExit(f"{art}/manifest.json: the registered simulation_sampler.algorithm is {algorithm!r}; this "
                         f"run fits only {list(pg.ADAPTIVE_CANDIDATES)}: give --algorithm")
    target_accept = args.target_accept if args.target_accept is not None else s["target_accept"]
    # the registered floor of a pooled length's chains (helper chains below it); 0 for the others
    opts = {**pg.candidate_options(algorithm), "min_pooled_chains": s["min_pooled_chains"]}
    warmup = args.warmup if args.warmup is not None else s["warmup"]
    draws = args.draws or s["draws"]
    extensions = top["max_extensions"] if args.extensions is None else args.extensions
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / args.json
    res = {"what": "issue 28: every simulated block fitted on the device, with item 3(a)'s comparison where the "
                   "export holds references; benchmarks/power_gpu_blocks.py run",
           "devices": [str(d) for d in devices], "device_kind": devices[0].device_kind, "jax": jax.__version__,
           "backend_init_s": backend_init_s,
           "blackjax": __import__("blackjax").__version__, "export": {k: v for k, v in top.items() if k != "per_block"},
           "sampler": {"algorithm": algorithm, "chains": chains, "warmup": warmup, "draws": draws,
                       "target_accept": target_accept, "extensions": extensions,
                       "extension_draws": top["extension_draws"], "chunk_draws": args.chunk_draws,
                       "seed_offset": args.seed_offset,
                       "min_pooled_chains": opts["min_pooled_chains"] if opts["pool_length"] else None},
           "blocks": {}, "skipped": [], "load_before": os.getloadavg()}

    def save():
        res["elapsed_s"] = time.perf_counter() - t_start
        res["imported_heavy_modules"] = sorted(m for m in HEAVY if m in sys.modules)
        path.write_text(json.dumps(res, indent=1, default=float) + "\n")

    if args.resume and args.save_draws and Path(args.resume).resolve() == Path(args.save_draws).resolve():
        raise SystemExit(f"--resume {args.resume} is the --save-draws folder: rescore reads every .npz there as a "
                         f"run's draws; give the checkpoints a folder of their own")
    blocks = args.blocks or top["blocks"]
    per_row_s = None  # seconds per (dataset x row) of the last block fitted: the next block's projection
    for block in blocks:
        d = art / block
        m = json.loads((d / "manifest.json").read_text())
        arr = np.load(d / "arrays.npz")
        F = args.first_dataset
        if F >= len(m["datasets"]):
            raise SystemExit(f"--first-dataset {F}: block {block} of {art} holds {len(m['datasets'])} datasets")
        K = min(args.datasets or len(m["datasets"]) - F, len(m["datasets"]) - F)
        numbers = np.arange(F, F + K)
        V = int((numbers < m["validate_datasets"]).sum())  # the run's datasets that have a reference
        # a subset --without-references: the validation datasets are fitted as the references saw them,
        # and scored where the references are (rescore --draws with the whole export)
        scoring = V and "references_left_in" not in m
        if per_row_s is not None:
            why = past_deadline(per_row_s * K * m["rows"] * (warmup + draws * (1 + extensions)) / (warmup + draws),
                                deadline)
            if why:
                res["skipped"].append(f"{block}: {why}")
                save()
                continue
        t = time.perf_counter()
        exported = (d / pg.EXPORT_FILE).read_bytes()
        ld = vec.exported_logdensity(gzip.decompress(exported))
        sampler = vec.BatchedAdaptiveHMC(ld, m["dim"], arr["x0"], arr["keep_idx"], target_accept=target_accept,
                                         dense_idx=arr["dense_idx"] if opts["dense"] else None,
                                         shrink_dense=opts["shrink_dense"], pool_length=opts["pool_length"],
                                         min_pooled_chains=opts["min_pooled_chains"])
        # every dataset adapts its own kernel from a seeded cold start about the model's initial point
        start = vec.FrozenHMC.cold_start(arr["x0"], chains, seed)
        Y = arr["Y"][F:F + K].astype(np.float64)
        # the validation datasets exactly as the references saw them (in a subset --without-references,
        # every dataset: float64_outcomes)
        exact = int((numbers < len(arr["Y_validate"])).sum())
        Y[:exact] = arr["Y_validate"][F:F + exact]
        # --resume: the chains as a stopped process of this very run left them (its checkpoint after the
        # warm-up and after each chunk), so a session's or lease's end loses at most one chunk
        checkpoint = Path(args.resume) / f"{block}.fit.npz" if args.resume else None
        built_from = {"Y": Y, "x0": arr["x0"], "keep_idx": arr["keep_idx"], "dense_idx": arr["dense_idx"]}
        fingerprint = run_fingerprint(exported, built_from, block=block, first_dataset=F, datasets=K, chains=chains,
                                      seed=seed, warmup=warmup, first_draws=args.chunk_draws or draws,
                                      algorithm=algorithm, target_accept=target_accept,
                                      min_pooled_chains=opts["min_pooled_chains"] if opts["pool_length"] else None,
                                      platform=devices[0].platform, settings_sha256=top["settings_sha256"])
        try:
            fit = vec.load_fit(checkpoint, fingerprint) if checkpoint else None
        except ValueError as e:
            raise SystemExit(f"--resume: {e}") from None
        tm: dict = {}
        if fit is not None:
            if fit["kept"].shape[2] > draws:
                raise SystemExit(f"--resume: {checkpoint} holds {fit['kept'].shape[2]} draws per chain, more than "
                                 f"--draws {draws}: ask for at least as many, or name another --resume folder")
            tm = dict(fit["meta"])
            res.setdefault("resumed", {})[block] = {"draws": int(fit["kept"].shape[2]), "checkpoint": str(checkpoint),
                                                    "run_s_before": tm["run_s"]}
            print(f"[{time.perf_counter() - t_start:.0f} s] {block}: resumed at {fit['kept'].shape[2]} draws "
                  f"from {checkpoint}", flush=True)

        def keep(fit):
            if checkpoint:
                checkpoint.parent.mkdir(parents=True, exist_ok=True)
                vec.save_fit(fit, checkpoint, fingerprint, meta=tm)  # the seconds so far: a resumed run_s adds them

        # a killed run (a lease's timeout) still says what it was doing and since when
        res["in_progress"] = {"block": block, "datasets": K, "since_elapsed_s": time.perf_counter() - t_start,
                              "what": f"warm-up {warmup} + first {args.chunk_draws or draws} draws, one program"}
        if fit is None:
            save()
            fit = sampler.fit_kept(Y, start, seed + 1, warmup, args.chunk_draws or draws, timings=tm)
            keep(fit)
            print(f"[{time.perf_counter() - t_start:.0f} s] {block}: warm-up {warmup} + {fit['kept'].shape[2]} draws "
                  f"of {K} dataset(s) in {tm['run_s']:.0f} s" + (f", checkpoint {checkpoint}" if checkpoint else ""),
                  flush=True)
        draws_cut = None
        # --chunk-draws: the registered draws in chunks continuing the frozen kernels (the chains are the same
        # Markov chains), so a fit that would outrun the deadline stops between chunks with its draws kept.
        # A chunk's seconds: the last chunk's, or its share of the seconds so far (a warm-up step costs a draw's).
        chunk_s = tm["run_s"] * args.chunk_draws / (warmup + fit["kept"].shape[2]) if args.chunk_draws else 0.0
        while (made := int(fit["kept"].shape[2])) < draws:
            n = min(args.chunk_draws, draws - made)
            why = past_deadline(chunk_s * n / args.chunk_draws, deadline)
            if why:
                draws_cut = f"{made} of {draws} draws: the next chunk's {why}"
                break
            res["in_progress"].update(what=f"draws {made} to {made + n}", since_elapsed_s=time.perf_counter() - t_start)
            save()
            tc: dict = {}
            fit = sampler.extend(Y, fit, seed + 1000 + made, n, timings=tc)
            tm["run_s"], tm["compile_s"] = tm["run_s"] + tc["run_s"], tm["compile_s"] + tc["compile_s"]
            chunk_s = tc["run_s"]
            keep(fit)
            left = draws - made - n
            print(f"[{time.perf_counter() - t_start:.0f} s] {block}: {made + n} of {draws} draws, this chunk "
                  f"{chunk_s:.0f} s" + (f", about {chunk_s * left / n:.0f} s to the last draw" if left else ""),
                  flush=True)
        contrast_draws = contrasts_of(arr["contrast_W"], arr["contrast_c"], m["contrasts"])

        # the remedy as power_simulation's accelerator path runs it (vectorised.extend_missing): only the
        # datasets missing the rule continue, each with its own kernel, in a program of their own; an
        # extended dataset has more draws than the others. A round costs about its draws' share of the
        # first fit (lockstep: a few datasets cost about what the batch costs); one that would pass the
        # deadline is not started (recorded), so a lease ends with this block's figures written.
        # Extensions' compile seconds are kept apart: a simulation compiles each shape once per process.
        remedied = vec.extend_missing(
            sampler, Y, fit, contrast_draws,
            lambda draws, div: validation.convergence_counts(draws, rule, div)["failing"],
            seed + 2, top["extension_draws"], extensions,
            stop=lambda r: past_deadline(tm["run_s"] * top["extension_draws"] / (warmup + made), deadline))
        h, divs, extended = remedied.draws, remedied.divergences, remedied.extended
        ext_s, ext_compile_s, cut, rounds = remedied.run_s, remedied.compile_s, remedied.stopped, len(extended)
        # the candidate's last remedy (accelerated.fit_block): a dataset still divergent after its extensions
        # is fitted again, warm-up and extensions included, in the frame form the rule did not pick, and
        # that fit is kept (an export made before the other form was kept has none: recorded)
        refit = other_form_refit(d, m, arr, opts, target_accept, chains, warmup, made, Y, remedied,
                                 rule, top, extensions,
                                 lambda need: past_deadline(need, deadline), tm["run_s"], seed)
        forms = [m["frame_form"]] * K
        for j in (refit or {}).get("refitted", []):
            forms[j] = refit["form"]
        counts = validation.convergence_counts(h, rule, divs)
        lengths = np.array([x.shape[1] for x in h[m["contrasts"][0]]])
        wall = time.perf_counter() - t
        run_s = tm["run_s"] + ext_s + (refit or {}).get("run_s", 0.0)
        per_row_s = run_s / (K * m["rows"]) * (warmup + draws) / (warmup + lengths.max())
        ad = fit["adapted"]
        entry = {"kind": m["kind"], "rows": m["rows"], "dim": m["dim"], "datasets": K, "first_dataset": F,
                 "chains": chains, "warmup_chains": sampler.warmup_chains(K, chains),
                 "compile_s": tm["compile_s"], "run_s": tm["run_s"], "extensions": rounds,
                 "datasets_extended": extended, "extension_s": ext_s,
                 "extension_compile_s": ext_compile_s, "extensions_cut_by_deadline": cut,
                 "wall_s": wall, "s_per_dataset": run_s / K, "datasets_per_hour": 3600.0 * K / run_s,
                 # the first fit's seconds scaled to the registered lengths (warm-up + draws), for a run at
                 # shorter lengths; extensions are not in it
                 "s_per_dataset_first_fit_at_validated_lengths":
                     tm["run_s"] / K * (s["warmup"] + s["draws"]) / (warmup + made),
                 "draws_cut_by_deadline": draws_cut,
                 # every chain runs the batch's longest trajectory of each transition (lockstep);
                 # a dataset's gradients include its extensions', the batch's steps its first fit's
                 "gradients_per_dataset": float(np.mean([np.sum(g) for g in remedied.gradients])),
                 "batch_leapfrog_steps": int(np.asarray(fit["gradients"]).max()),
                 "draws_per_chain": int(fit["kept"].shape[2]),
                 "draws_per_chain_per_dataset": lengths.tolist(),
                 "divergences_per_dataset": [int(np.sum(dv)) for dv in divs],
                 "frame_form_per_dataset": forms, "refit_other_form": refit,
                 "step_size": [float(v) for v in ad.step_size],
                 "trajectory_length": [float(v) for v in ad.trajectory_length],
                 "convergence": counts}
        if scoring:
            entry["validation"] = scored(h, counts["failing"], arr, m, top, numbers)
            comp, verdict = entry["validation"], entry["validation"]["verdict"]
        elif V:
            entry["validation_left_to"] = f"rescore --draws with {m['references_left_in']} (its references)"
        if args.save_draws:  # every chain's contrast draws and the adapted kernels, for a diagnosis
            Path(args.save_draws).mkdir(parents=True, exist_ok=True)
            # an extended dataset has more draws: each dataset's row is padded with NaN to the longest
            padded = {name: np.stack([np.pad(x, ((0, 0), (0, lengths.max() - x.shape[1])), constant_values=np.nan)
                                      for x in xs]) for name, xs in h.items()}
            np.savez_compressed(Path(args.save_draws) / f"{block}.npz", **padded, draws_per_dataset=lengths,
                                step_size=ad.step_size, trajectory_length=ad.trajectory_length,
                                divergences=np.stack(divs), failing=np.asarray(counts["failing"]), first_dataset=F,
                                frame_form=np.asarray([str(f) for f in forms]),
                                # the draws made: a run cut by its deadline is not the sampler an SBC vouches for
                                sampler=json.dumps({**res["sampler"], "draws": made}, sort_keys=True))
        res["blocks"][block] = entry
        res.pop("in_progress", None)
        save()
        brief = {k: entry[k] for k in ("compile_s", "run_s", "extensions", "s_per_dataset", "datasets_per_hour")}
        print(f"[{time.perf_counter() - t_start:.0f} s] {block}: {json.dumps(brief, default=float)} failing "
              f"{counts['datasets_failing_any']} of {K}" + (f"; vs reference: max |z| {comp['max_z']:.2f} (bound "
                                                          f"{comp['z_bound']:.2f}), label flips {comp['label_flips']}, "
                                                          f"{verdict['status']}"
                                                          if scoring else ""), flush=True)
    done = res["blocks"]
    if done:
        total = sum(v["s_per_dataset"] for v in done.values())
        first = sum(v["s_per_dataset_first_fit_at_validated_lengths"] for v in done.values())
        res["all_blocks"] = {"blocks": list(done), "s_per_dataset": total, "datasets_per_hour": 3600.0 / total,
                             "s_per_dataset_first_fit_at_validated_lengths": first,
                             "complete": len(done) == len(top["blocks"]),
                             "primary_fit_equivalents": (total / done["primary"]["s_per_dataset"]
                                                         if "primary" in done else None)}
        compared = [v["validation"] for v in done.values() if "validation" in v]
        res["validation"] = {"blocks": [b for b, v in done.items() if "validation" in v],
                             "label_flips": sum(v["label_flips"] for v in compared),
                             "label_flips_not_near_boundary": sum(v["label_flips_not_near_boundary"] for v in compared),
                             "max_endpoint_z": max((v["max_endpoint_z"] for v in compared), default=float("nan")),
                             "comparison_passed": bool(compared) and all(v["passed"] for v in compared),
                             "status": next((st for st in ("failed", "incomplete", "passed")
                                             if any(v["verdict"]["status"] == st for v in compared)), "not run"),
                             "reasons": [f"{b}: {r}" for b, v in done.items() if "validation" in v
                                         for r in v["validation"]["verdict"]["reasons"]]}
    res["load_after"] = os.getloadavg()
    save()
    a, v = res.get("all_blocks"), res.get("validation")
    fails = sum(x["convergence"]["datasets_failing_any"] for x in done.values())
    print(f"power_gpu_blocks: device={res['devices'][0]} blocks={len(done)} of {len(blocks)} "
          + (f"s_per_dataset_all={a['s_per_dataset']:.3f} datasets_per_hour_all={a['datasets_per_hour']:.1f} "
             f"failing_datasets={fails} label_flips={v['label_flips']} max_endpoint_z={v['max_endpoint_z']:.2f} "
             f"validation={v['status']} "
             if a else "no block fitted (see skipped) ")
          + f"imported_heavy={res['imported_heavy_modules']} json={path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="every block's log density, datasets and references (needs PyMC and nutpie)")
    e.add_argument("--frames", type=int, default=50)
    e.add_argument("--depths", type=int, default=8)
    e.add_argument("--datasets", type=int, default=32, help="datasets per block (K)")
    e.add_argument("--blocks", nargs="*", help="default: every reported block (blocks.REPORTED)")
    e.add_argument("--scenario", default="meaningful")
    e.add_argument("--validate-blocks", nargs="*", default=["primary"],
                   help="blocks whose first datasets get a long nutpie reference (item 3(a) on the device)")
    e.add_argument("--validate-datasets", type=int, default=4)
    e.add_argument("--reference-draws", type=int, default=1000, help="draws per chain of the reference (4 chains)")
    e.add_argument("--reference-cache", default=str(pg.REFERENCE_CACHE),
                   help="where each reference attempt is kept and read back (as references keeps them)")
    e.add_argument("--check-points", type=int, default=2)
    e.add_argument("--out", default=str(ART))
    r = sub.add_parser("run", help="fit every exported block on this machine's accelerator (no PyMC)")
    r.add_argument("--artefacts", default=str(ART))
    r.add_argument("--platform", help="JAX_PLATFORMS (cuda, cpu); default: jax's choice")
    r.add_argument("--blocks", nargs="*", help="default: every exported block")
    r.add_argument("--datasets", type=int, help="datasets per block (default: every exported one from the first)")
    r.add_argument("--first-dataset", type=int, default=0,
                   help="the export's dataset to start from: a CPU fits a validation's datasets in several runs "
                        "(rescore scores their saved draws together)")
    r.add_argument("--algorithm", choices=pg.ADAPTIVE_CANDIDATES,
                   help="default: the registered simulation_sampler section's")
    r.add_argument("--chains", type=int, help="default: the simulation_sampler section's")
    r.add_argument("--warmup", type=int, help="per dataset (default: the simulation_sampler section's)")
    r.add_argument("--draws", type=int, help="default: the simulation_sampler section's")
    r.add_argument("--target-accept", type=float, help="default: the simulation_sampler section's")
    r.add_argument("--seed-offset", type=int, default=0,
                   help="another seed for the sampler (the master seed + 100,000 x this): repeats of one run, to "
                        "tell a sampler's spread from its bias; 0, the default, is the run a validation scores")
    r.add_argument("--extensions", type=int, help="default: the registered remedy's max_extensions")
    r.add_argument("--max-seconds", type=float, default=300.0)
    r.add_argument("--chunk-draws", type=int, default=0,
                   help="draw in chunks of N after the warm-up, stopping between chunks at the deadline (0: one program)")
    r.add_argument("--save-draws", help="a folder: each block's contrast draws per chain and adapted kernels (.npz)")
    r.add_argument("--resume", help="a folder for each block's checkpoint (after the warm-up and every chunk): a "
                        "stopped run started again with the same options continues its chains where they stopped")
    r.add_argument("--json", default="power_gpu_blocks.json", help="result file name under $OUT (or benchmarks/results)")
    c = sub.add_parser("subset", help="a copy of an export with fewer blocks or datasets, for a lease's 64 MiB")
    c.add_argument("--artefacts", default=str(ART))
    c.add_argument("--out", required=True)
    c.add_argument("--blocks", nargs="+", required=True)
    c.add_argument("--datasets", type=int, required=True, help="datasets kept per block (not fewer than its references)")
    c.add_argument("--whole", nargs="*", default=[], help="blocks that keep every dataset")
    c.add_argument("--without-references", action="store_true",
                   help="leave the references out (scored here: rescore --draws with this export); every kept "
                        "dataset is fitted in float64, as its reference sees it")
    f = sub.add_parser("references", help="more nutpie references for one block of an export, resumable "
                       "(needs PyMC and nutpie)")
    f.add_argument("--artefacts", default=str(ART))
    f.add_argument("--block", default="primary")
    f.add_argument("--datasets", type=int, required=True, help="validation datasets wanted in all")
    f.add_argument("--reference-draws", type=int, default=4000, help="draws per chain, as the export's references")
    f.add_argument("--reference-cache", default=str(pg.REFERENCE_CACHE),
                   help="where each reference attempt is kept, so a stopped run resumes")
    n = sub.add_parser("null", help="the registered sampler against the export's references: the rule's false "
                       "alarms (needs PyMC and nutpie)")
    n.add_argument("--artefacts", default=str(ART))
    n.add_argument("--block", default="primary")
    n.add_argument("--datasets", type=int, help="validation datasets used (default: every one with a reference)")
    n.add_argument("--first-dataset", type=int, default=0, help="the first validation dataset used")
    n.add_argument("--runs", type=int, default=2, help="independent short runs per dataset")
    n.add_argument("--run-offset", type=int, default=0,
                   help="the first run's number: its seeds; runs 0..--runs-1 by default, so an offset gives new ones")
    n.add_argument("--draws", type=int, default=500, help="draws per chain of a short run (the candidate's)")
    n.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "power_gpu_null.json"),
                   help="the result; the short runs' draws are kept beside it (.draws.npz)")
    n.add_argument("--reuse-draws", action="store_true", help="score the kept short runs again instead of sampling")
    q = sub.add_parser("rescore", help="item 3(a) again on a run's saved draws (run --save-draws) against the "
                       "export's references")
    q.add_argument("--artefacts", default=str(ART))
    q.add_argument("--draws", required=True, nargs="+",
                   help="the folder(s) run --save-draws wrote: runs of disjoint datasets are scored as one")
    q.add_argument("--sbc", help="a power_gpu.py validate JSON whose SBC (item 3(b), a reduced design) completes the "
                                 "verdict: the same sampler settings and registered settings, >= 500 prior draws")
    q.add_argument("--null", nargs="+", help="null JSONs (the registered sampler against the same references): "
                                             "each contrast's lean beyond them, reported beside the verdict")
    q.add_argument("--json", required=True)
    w = sub.add_parser("spread", help="a sampler's run-to-run spread against its MCSE, from runs of the same "
                       "datasets with other seeds (run --seed-offset --save-draws)")
    w.add_argument("--artefacts", default=str(ART))
    w.add_argument("--draws", required=True, nargs="+", help="one folder per run (run --save-draws), two or more")
    w.add_argument("--json", required=True)
    j = sub.add_parser("verdict", help="item 3(a) at registered size over every registered scenario, from one "
                       "rescore JSON each: the record a host's power_sampler.validation names")
    j.add_argument("--rescored", required=True, nargs="+", help="rescore JSONs, one per registered scenario")
    j.add_argument("--block", default="primary")
    j.add_argument("--json", required=True)
    args = p.parse_args()
    return {"export": export, "subset": subset, "run": run, "references": references, "null": null,
            "rescore": rescore, "spread": spread, "verdict": verdict}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
