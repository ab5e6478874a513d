"""The device run of every simulated block (issue 28, item 5; benchmarks/power_gpu_blocks.py) on
CPU at a small size: the export here (PyMC, nutpie references) and the run from another folder
without PyMC, ArviZ, pandas or the analysis code, reporting every block's speed, convergence and,
where the export holds references, item 3(a)'s comparison and verdict.

Slow (about 10 PyTensor-to-JAX exports, nutpie references and JAX compilations): run it with
-m slow before a device session."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from fear_assets.core.settings import PROJECT_ROOT
from fear_assets.simulation import validation
from fear_assets.simulation.sampler_path import VALIDATED_FIELDS, validation_status

SCRIPT = PROJECT_ROOT / "benchmarks" / "power_gpu_blocks.py"


@pytest.mark.slow
def test_every_block_runs_on_the_device_path_without_pymc_and_reports_its_verdict(tmp_path, settings):
    art = tmp_path / "blocks"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT)}
    export = subprocess.run([sys.executable, str(SCRIPT), "export", "--frames", "5", "--depths", "1", "--datasets", "2",
                             "--blocks", "primary", "forced_choice", "--validate-blocks", "primary",
                             "--validate-datasets", "1", "--reference-draws", "200", "--out", str(art),
                             "--reference-cache", str(tmp_path / "cache")],
                            env=env, capture_output=True, text=True, timeout=1200)
    assert export.returncode == 0, export.stderr[-3000:]
    top = json.loads((art / "manifest.json").read_text())
    assert top["blocks"] == ["primary", "forced_choice"] and top["settings_sha256"] == settings.sha256
    for block in top["blocks"]:
        m = json.loads((art / block / "manifest.json").read_text())
        assert max(m["check_vs_pymc"]["max_diff"]["logp_rel"], m["check_vs_pymc"]["max_diff"]["dlogp_rel"]) < 1e-8
    first = json.loads((art / "primary" / "manifest.json").read_text())
    assert first["contrasts"] == ["H1", "H2", "H3"] and first["validate_datasets"] == 1
    # a primary-model block carries its other frame form too (the candidate's refit), checked the same
    other = first["other_form"]
    assert {other["form"], first["frame_form"]} == {"centred", "non_centred"}
    assert max(other["check_vs_pymc"]["max_diff"]["logp_rel"], other["check_vs_pymc"]["max_diff"]["dlogp_rel"]) < 1e-8
    assert json.loads((art / "forced_choice" / "manifest.json").read_text())["other_form"] is None
    assert len(first["reference"]["attempts"]) == 1 and top["per_block"]["primary"]["validate_datasets"] == 1
    assert len(list((tmp_path / "cache").glob("reference-primary-*.npz"))) == len(first["reference"]["attempts"][0])

    out = tmp_path / "out"
    device_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    device_env.update(OUT=str(out), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                          "--warmup", "30", "--draws", "30", "--extensions", "0", "--max-seconds", "600",
                          "--save-draws", str(tmp_path / "first")],
                         cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads((out / "power_gpu_blocks.json").read_text())
    assert res["imported_heavy_modules"] == []
    assert set(res["blocks"]) == {"primary", "forced_choice"} and not res["skipped"]
    for block, entry in res["blocks"].items():
        assert entry["datasets"] == 2 and entry["draws_per_chain"] == 30
        assert entry["gradients_per_dataset"] >= entry["chains"] * 60  # (30 + 30) transitions, >= 1 step each
        assert len(entry["divergences_per_dataset"]) == 2
    total = res["all_blocks"]["s_per_dataset"]
    assert total == pytest.approx(sum(e["s_per_dataset"] for e in res["blocks"].values()))
    assert res["all_blocks"]["complete"] and res["all_blocks"]["primary_fit_equivalents"] > 1
    # item 3(a) on the device: the primary block's validation dataset against its nutpie reference
    v = res["blocks"]["primary"]["validation"]
    assert v["datasets"] == 1 and v["comparisons"] == 3 * 4 and "validation" not in res["blocks"]["forced_choice"]
    # the verdict follows from its parts; with no SBC it is never "passed"
    failing = res["blocks"]["primary"]["convergence"]["failing"][0]
    expected = "failed" if not v["passed"] or failing else "incomplete"
    assert v["verdict"]["status"] == expected == res["validation"]["status"]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("power_gpu_blocks: device=cpu") and f"validation={expected}" in last

    # the candidate's last remedy: a dataset still divergent after its extensions is fitted again in the other
    # frame form, and that fit is what is kept. Divergences forced: a target acceptance of 0.3 (long steps)
    forced = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                             "--blocks", "primary", "--warmup", "30", "--draws", "30", "--extensions", "0",
                             "--target-accept", "0.3", "--json", "refit.json", "--save-draws", str(tmp_path / "refit")],
                            cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert forced.returncode == 0, forced.stderr[-3000:]
    entry = json.loads((out / "refit.json").read_text())["blocks"]["primary"]
    refit = entry["refit_other_form"]
    assert refit["datasets_divergent"], entry["divergences_per_dataset"]  # the case is there
    assert refit["refitted"] == refit["datasets_divergent"] and refit["form"] == other["form"]
    assert refit["divergences_before"] and all(n > 0 for n in refit["divergences_before"])
    assert [entry["divergences_per_dataset"][j] for j in refit["refitted"]] == refit["divergences_after"]
    assert entry["frame_form_per_dataset"] == [other["form"] if j in refit["refitted"] else first["frame_form"]
                                               for j in range(2)]
    assert np.load(tmp_path / "refit" / "primary.npz")["frame_form"].tolist() == entry["frame_form_per_dataset"]

    # a lease that runs out: the first block's draws stop between chunks and its failing datasets are not
    # extended past the deadline (said in its entry, whose figures are written), and the next block is
    # skipped and named, not started
    short = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                            "--warmup", "30", "--draws", "30", "--chunk-draws", "10", "--extensions", "2",
                            "--max-seconds", "0.5", "--resume", str(tmp_path / "checkpoint"),
                            "--json", "short.json", "--save-draws", str(tmp_path / "short_draws")],
                           cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert short.returncode == 0, short.stderr[-3000:]
    cut = json.loads((out / "short.json").read_text())
    primary = cut["blocks"]["primary"]
    assert primary["convergence"]["datasets_failing_any"] > 0  # 30 + 30 transitions never meet ESS 400
    assert primary["draws_per_chain"] == 10 and primary["draws_cut_by_deadline"].startswith("10 of 30 draws")
    assert primary["extensions"] == 0 and primary["extensions_cut_by_deadline"].startswith("round 1 of 2 not run")
    assert set(cut["blocks"]) == {"primary"} and cut["skipped"][0].startswith("forced_choice: projected")
    assert "in_progress" not in cut  # finished blocks leave no marker
    # its saved draws record the draws made, so an SBC of the 30-draw sampler does not vouch for them
    assert json.loads(str(np.load(tmp_path / "short_draws" / "primary.npz")["sampler"]))["draws"] == 10
    # the stopped run started again (--resume): its chains continue from the checkpoint the cut left, and
    # its draws are, to the byte, those of a run that never stopped; another run's checkpoint is refused
    common = ["run", "--artefacts", str(art), "--platform", "cpu", "--blocks", "primary", "--warmup", "30", "--draws",
              "30", "--chunk-draws", "10", "--extensions", "0", "--max-seconds", "600"]
    resumed = subprocess.run([sys.executable, str(SCRIPT), *common, "--resume", str(tmp_path / "checkpoint"),
                              "--json", "resumed.json", "--save-draws", str(tmp_path / "resumed_draws")],
                             cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "resumed.json").read_text())["resumed"]["primary"]["draws"] == 10
    unbroken = subprocess.run([sys.executable, str(SCRIPT), *common, "--json", "unbroken.json",
                               "--save-draws", str(tmp_path / "unbroken_draws")],
                              cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    again = np.load(tmp_path / "resumed_draws" / "primary.npz")
    whole = np.load(tmp_path / "unbroken_draws" / "primary.npz")
    for name in first["contrasts"] + ["divergences", "step_size", "trajectory_length"]:
        assert again[name].shape == whole[name].shape and again[name].tobytes() == whole[name].tobytes(), name
    other_seed = subprocess.run([sys.executable, str(SCRIPT), *common, "--seed-offset", "1", "--resume",
                                 str(tmp_path / "checkpoint"), "--json", "other.json"],
                                cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert other_seed.returncode != 0 and "checkpoint of another run" in other_seed.stderr

    # subset: what a lease carries, blocks cut to fewer datasets but never fewer than their references compare
    lease = tmp_path / "lease"
    cut_export = subprocess.run([sys.executable, str(SCRIPT), "subset", "--artefacts", str(art), "--out", str(lease),
                                 "--blocks", "forced_choice", "primary", "--datasets", "0", "--whole", "forced_choice"],
                                env=device_env, capture_output=True, text=True, timeout=300)
    assert cut_export.returncode == 0, cut_export.stderr[-3000:]
    assert len(json.loads((lease / "forced_choice" / "manifest.json").read_text())["datasets"]) == 2
    assert len(json.loads((lease / "primary" / "manifest.json").read_text())["datasets"]) == 1
    assert (lease / "primary" / "logdensity.other_form.jaxexport.gz").exists()
    on_lease = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(lease), "--platform", "cpu",
                               "--blocks", "primary", "--warmup", "20", "--draws", "20", "--extensions", "0",
                               "--json", "lease.json", "--save-draws", str(tmp_path / "lease_draws")],
                              cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert on_lease.returncode == 0, on_lease.stderr[-3000:]
    leased = json.loads((out / "lease.json").read_text())["blocks"]["primary"]
    assert leased["datasets"] == 1 and leased["validation"]["datasets"] == 1
    # a lease without the references (smaller, so several scenarios fit): the same fit, scored here
    light = tmp_path / "light"
    light_export = subprocess.run([sys.executable, str(SCRIPT), "subset", "--artefacts", str(art), "--out", str(light),
                                   "--blocks", "primary", "--datasets", "0", "--without-references"],
                                  env=device_env, capture_output=True, text=True, timeout=300)
    assert light_export.returncode == 0, light_export.stderr[-3000:]
    assert (light / "primary" / "arrays.npz").stat().st_size < (lease / "primary" / "arrays.npz").stat().st_size
    on_light = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(light), "--platform", "cpu",
                               "--blocks", "primary", "--warmup", "20", "--draws", "20", "--extensions", "0",
                               "--json", "light.json", "--save-draws", str(tmp_path / "light_draws")],
                              cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert on_light.returncode == 0, on_light.stderr[-3000:]
    lit = json.loads((out / "light.json").read_text())
    assert "validation" not in lit["blocks"]["primary"] and lit["validation"]["status"] == "not run"
    assert str(art) in lit["blocks"]["primary"]["validation_left_to"]
    scored_here = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                                  str(tmp_path / "light_draws"), "--json", str(tmp_path / "light_rescore.json")],
                                 env=device_env, capture_output=True, text=True, timeout=900)
    assert scored_here.returncode == 0, scored_here.stderr[-3000:]
    assert json.loads((tmp_path / "light_rescore.json").read_text())["blocks"]["primary"]["rows"] == \
        leased["validation"]["rows"]

    # --chunk-draws: the draws in chunks continuing the warm-up's kernels, all of them when time allows
    chunked = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                              "--blocks", "forced_choice", "--warmup", "30", "--draws", "30", "--chunk-draws", "10",
                              "--extensions", "0", "--max-seconds", "600", "--json", "chunked.json",
                              # the pooled candidate, and every chain's draws kept for a diagnosis
                              "--algorithm", "adaptive_hmc_dense_pooled", "--save-draws", str(tmp_path / "draws")],
                             cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert chunked.returncode == 0, chunked.stderr[-3000:]
    chunked_res = json.loads((out / "chunked.json").read_text())
    fc = chunked_res["blocks"]["forced_choice"]
    assert chunked_res["sampler"]["algorithm"] == "adaptive_hmc_dense_pooled"
    # a pooled program of few datasets warms up on helper chains up to the floor, and keeps its registered chains
    floor = chunked_res["sampler"]["min_pooled_chains"]
    assert floor == settings.simulation_sampler.min_pooled_chains and fc["datasets"] * fc["chains"] < floor
    assert fc["warmup_chains"] > fc["chains"] and fc["datasets"] * fc["warmup_chains"] >= floor
    assert fc["draws_per_chain"] == 30 and fc["draws_cut_by_deadline"] is None
    saved = np.load(tmp_path / "draws" / "forced_choice.npz")
    contrasts = json.loads((art / "forced_choice" / "manifest.json").read_text())["contrasts"]
    assert all(saved[c].shape == (fc["datasets"], fc["chains"], 30) for c in contrasts)
    np.testing.assert_array_equal(saved["trajectory_length"], fc["trajectory_length"])
    assert saved["failing"].tolist() == fc["convergence"]["failing"]
    assert fc["gradients_per_dataset"] >= fc["chains"] * 60

    # a lease made before a dataset's reference exists still fits that dataset as the reference will see it
    early = tmp_path / "early"
    early_export = subprocess.run([sys.executable, str(SCRIPT), "subset", "--artefacts", str(art), "--out", str(early),
                                   "--blocks", "primary", "--datasets", "2", "--without-references"],
                                  env=env, capture_output=True, text=True, timeout=300)
    assert early_export.returncode == 0, early_export.stderr[-3000:]
    early_outcomes = np.load(early / "primary" / "arrays.npz")["Y_validate"]
    assert early_outcomes.shape[0] == 2 and early_outcomes.dtype == np.float64

    # references: one more nutpie reference for the exported primary block, the first kept as it was
    before = dict(np.load(art / "primary" / "arrays.npz"))
    more = subprocess.run([sys.executable, str(SCRIPT), "references", "--artefacts", str(art), "--block", "primary",
                           "--datasets", "2", "--reference-draws", "200", "--reference-cache", str(tmp_path / "cache")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert more.returncode == 0, more.stderr[-3000:]
    after = dict(np.load(art / "primary" / "arrays.npz"))
    m = json.loads((art / "primary" / "manifest.json").read_text())
    assert m["validate_datasets"] == 2 and len(m["reference"]["attempts"]) == 2
    assert after["reference_H1"].shape == (2, 4, 200) and after["Y_validate"].shape[0] == 2
    np.testing.assert_array_equal(after["reference_H1"][0], before["reference_H1"][0])
    np.testing.assert_array_equal(after["Y_validate"][1].astype(np.float32), after["Y"][1])
    np.testing.assert_array_equal(early_outcomes, after["Y_validate"])  # float64 to the last bit, not float32's
    assert not (art / "primary" / "arrays.tmp.npz").exists()

    # rescore: the first run's saved draws scored again reproduce its own comparison row for row, and
    # now reach the second dataset's new reference too
    rescored = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                               str(tmp_path / "first"), "--json", str(tmp_path / "rescore.json")],
                              env=device_env, capture_output=True, text=True, timeout=900)
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    again = json.loads((tmp_path / "rescore.json").read_text())["blocks"]
    assert set(again) == {"primary"} and again["primary"]["datasets"] == 2
    assert again["primary"]["datasets_needed"] == 64 and not again["primary"]["enough_datasets"]
    assert [r for r in again["primary"]["rows"] if r["dataset"] == 0] == v["rows"]
    assert {r["dataset"] for r in again["primary"]["rows"]} == {0, 1}

    # a validation fitted in turns: dataset 1 alone (--first-dataset), then scored together with the lease's
    # run of dataset 0; each keeps its own rows, and a dataset saved by two runs is refused
    second = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                             "--blocks", "primary", "--first-dataset", "1", "--warmup", "20", "--draws", "20",
                             "--extensions", "1", "--json", "second.json", "--save-draws", str(tmp_path / "second")],
                            cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    one = json.loads((out / "second.json").read_text())["blocks"]["primary"]
    assert one["datasets"] == 1 and one["first_dataset"] == 1 and one["validation"]["dataset_numbers"] == [1]
    # 20 draws miss the rule: the remedy's one round continues the dataset (its own chains, registered draws)
    assert one["extensions"] == 1 and one["datasets_extended"] == [1]
    assert one["draws_per_chain_per_dataset"] == [20 + top["extension_draws"]] and one["draws_per_chain"] == 20
    assert {r["dataset"] for r in one["validation"]["rows"]} == {1}
    # --seed-offset: the same run with other sampler seeds (repeats, to tell spread from bias); the default
    # is the run a validation scores
    reseeded = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(art), "--platform", "cpu",
                               "--blocks", "primary", "--first-dataset", "1", "--warmup", "20", "--draws", "20",
                               "--extensions", "1", "--seed-offset", "1", "--json", "reseeded.json",
                               "--save-draws", str(tmp_path / "reseeded")],
                              cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert reseeded.returncode == 0, reseeded.stderr[-3000:]
    assert json.loads((out / "second.json").read_text())["sampler"]["seed_offset"] == 0
    assert json.loads((out / "reseeded.json").read_text())["sampler"]["seed_offset"] == 1
    first_draws = np.load(tmp_path / "second" / "primary.npz")["H1"][:, :, :20]
    assert not np.array_equal(np.load(tmp_path / "reseeded" / "primary.npz")["H1"][:, :, :20], first_draws)
    # spread: the two seeds' runs of dataset 1, each estimate's spread against its MCSE; runs of one seed twice,
    # or of other datasets, are refused
    spread = subprocess.run([sys.executable, str(SCRIPT), "spread", "--artefacts", str(art), "--draws",
                             str(tmp_path / "second"), str(tmp_path / "reseeded"),
                             "--json", str(tmp_path / "spread.json")],
                            env=device_env, capture_output=True, text=True, timeout=900)
    assert spread.returncode == 0, spread.stderr[-3000:]
    sp = json.loads((tmp_path / "spread.json").read_text())["blocks"]["primary"]
    assert sp["seed_offsets"] == [0, 1] and sp["dataset_numbers"] == [1] and sp["degrees_of_freedom"] == 3
    assert all(v["ratio"] > 0 and v["interval"][0] < v["ratio"] < v["interval"][1] for v in sp["spread_ratio"].values())
    for folders in ([tmp_path / "second", tmp_path / "second"], [tmp_path / "second", tmp_path / "lease_draws"]):
        refused = subprocess.run([sys.executable, str(SCRIPT), "spread", "--artefacts", str(art), "--draws",
                                  *map(str, folders), "--json", str(tmp_path / "refused.json")],
                                 env=device_env, capture_output=True, text=True, timeout=900)
        assert refused.returncode != 0 and "--draws" in refused.stderr, refused.stderr[-2000:]
    both = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                           str(tmp_path / "lease_draws"), str(tmp_path / "second"),
                           "--json", str(tmp_path / "both.json")],
                          env=device_env, capture_output=True, text=True, timeout=900)
    assert both.returncode == 0, both.stderr[-3000:]
    union = json.loads((tmp_path / "both.json").read_text())["blocks"]["primary"]
    assert union["dataset_numbers"] == [0, 1] and union["comparisons"] == 2 * 3 * 4
    assert [r for r in union["rows"] if r["dataset"] == 0] == leased["validation"]["rows"]
    assert [r for r in union["rows"] if r["dataset"] == 1] == one["validation"]["rows"]
    # the early lease's fit of dataset 1 (no reference when it was made), scored here: the same rows
    on_early = subprocess.run([sys.executable, str(SCRIPT), "run", "--artefacts", str(early), "--platform", "cpu",
                               "--blocks", "primary", "--first-dataset", "1", "--warmup", "20", "--draws", "20",
                               "--extensions", "1", "--json", "early.json",
                               "--save-draws", str(tmp_path / "early_draws")],
                              cwd=tmp_path, env=device_env, capture_output=True, text=True, timeout=900)
    assert on_early.returncode == 0, on_early.stderr[-3000:]
    early_scored = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                                   str(tmp_path / "early_draws"), "--json", str(tmp_path / "early_rescore.json")],
                                  env=device_env, capture_output=True, text=True, timeout=900)
    assert early_scored.returncode == 0, early_scored.stderr[-3000:]
    assert json.loads((tmp_path / "early_rescore.json").read_text())["blocks"]["primary"]["rows"] == \
        one["validation"]["rows"]
    twice = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                            str(tmp_path / "first"), str(tmp_path / "second"), "--json", str(tmp_path / "twice.json")],
                           env=device_env, capture_output=True, text=True, timeout=900)
    assert twice.returncode != 0 and "datasets [1] of block primary are in more than one" in twice.stderr
    # item 3(b) completes the verdict: a reduced design's SBC of the same sampler and settings (here a
    # validate JSON written for the test: its SBC passes), so "SBC not run" leaves the reasons
    ran = json.loads((out / "second.json").read_text())["sampler"]
    sbc = {"frames": 50, "depths": 1, "settings_sha256": top["settings_sha256"], "sampler": ran,
           "sbc": {"complete": True, "prior_draws": 500, "min_p": 0.2, "passed": True}}
    (tmp_path / "sbc.json").write_text(json.dumps(sbc))
    with_sbc = subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                               str(tmp_path / "lease_draws"), str(tmp_path / "second"), "--sbc",
                               str(tmp_path / "sbc.json"), "--json", str(tmp_path / "with_sbc.json")],
                              env=device_env, capture_output=True, text=True, timeout=900)
    assert with_sbc.returncode == 0, with_sbc.stderr[-3000:]
    judged = json.loads((tmp_path / "with_sbc.json").read_text())["blocks"]["primary"]
    assert judged["sbc"]["passed"] and judged["sampler"]["warmup"] == 20
    assert "SBC not run" in union["verdict"]["reasons"] and "SBC not run" not in judged["verdict"]["reasons"]
    assert judged["rows"] == union["rows"]
    # verdict: this one scenario's record, short of 64 datasets, the other registered scenarios not scored
    assert judged["settings_sha256"] == settings.sha256 and (judged["frames"], judged["depths"]) == (5, 1)
    joined = subprocess.run([sys.executable, str(SCRIPT), "verdict", "--rescored", str(tmp_path / "with_sbc.json"),
                             "--json", str(tmp_path / "verdict.json")], env=env, capture_output=True, text=True,
                            timeout=300)
    assert joined.returncode == 0, joined.stderr[-3000:]
    record = json.loads((tmp_path / "verdict.json").read_text())
    assert record["passed"] is False and record["sampler"] == judged["sampler"] and record["frames"] == 5
    assert record["scenarios"]["meaningful"]["datasets"] == 2
    assert record["verdict"]["reasons"][-3:] == ["meaningful: 2 of the 64 datasets a scenario needs",
                                                 "null: not scored", "sesoi: not scored"]
    assert validation_status(record, SimpleNamespace(**{k: ran[k] for k in VALIDATED_FIELDS})).status == "failed"

    # null: the registered sampler itself against the references, scored by the same rule
    nulled = subprocess.run([sys.executable, str(SCRIPT), "null", "--artefacts", str(art), "--runs", "1",
                             "--draws", "100", "--json", str(tmp_path / "null.json")],
                            env=env, capture_output=True, text=True, timeout=900)
    assert nulled.returncode == 0, nulled.stderr[-3000:]
    nr = json.loads((tmp_path / "null.json").read_text())
    assert nr["comparisons"] == 2 * 3 * 4 and len(nr["rows"]) == 2 * 3 and len(nr["short_divergences"]) == 2
    assert nr["passed"] == (max(nr["max_abs_z"].values()) <= nr["z_bound"])
    # the short runs are kept: scored again without sampling, the same rows
    again = subprocess.run([sys.executable, str(SCRIPT), "null", "--artefacts", str(art), "--runs", "1",
                            "--draws", "100", "--json", str(tmp_path / "null.json"), "--reuse-draws"],
                           env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "null.json").read_text())["rows"] == nr["rows"]
    # a shared shift is read on the null's own scale: sqrt(n) x the mean z of a contrast's rows
    h1_low = [row["z_hdi_low"] for row in nr["rows"] if row["contrast"] == "H1"]
    assert nr["shared_shift_z"]["H1.hdi_low"] == pytest.approx(np.sqrt(len(h1_low)) * np.mean(h1_low))
    # in sittings: dataset 1 alone, run 0 again (the same seeds: the same rows), and run 1 (new seeds)
    def without_run(rows):
        return [{k: v for k, v in row.items() if k != "run"} for row in rows]

    for offset in (0, 1):
        part = subprocess.run([sys.executable, str(SCRIPT), "null", "--artefacts", str(art), "--runs", "1",
                               "--first-dataset", "1", "--run-offset", str(offset), "--draws", "100",
                               "--json", str(tmp_path / f"null_1_{offset}.json")],
                              env=env, capture_output=True, text=True, timeout=900)
        assert part.returncode == 0, part.stderr[-3000:]
        pr = json.loads((tmp_path / f"null_1_{offset}.json").read_text())
        assert pr["dataset_numbers"] == [nr["dataset_numbers"][1]] and pr["runs"] == [offset]
        first = without_run(row for row in nr["rows"] if row["dataset"] == pr["dataset_numbers"][0])
        mine = without_run(pr["rows"])
        assert (mine == first) == (offset == 0)
    refused = subprocess.run([sys.executable, str(SCRIPT), "null", "--artefacts", str(art), "--first-dataset", "2",
                              "--json", str(tmp_path / "null_bad.json")], env=env, capture_output=True, text=True,
                             timeout=900)
    assert refused.returncode != 0 and "--first-dataset 2" in refused.stderr
    # the candidate's lean beyond the null, on the datasets both scored against the same references
    def rescored_with(null_json):
        return subprocess.run([sys.executable, str(SCRIPT), "rescore", "--artefacts", str(art), "--draws",
                               str(tmp_path / "lease_draws"), str(tmp_path / "second"), "--null", str(null_json),
                               "--json", str(tmp_path / "leaned.json")],
                              env=device_env, capture_output=True, text=True, timeout=900)

    leaned = rescored_with(tmp_path / "null.json")
    assert leaned.returncode == 0, leaned.stderr[-3000:]
    scored_again = json.loads((tmp_path / "leaned.json").read_text())["blocks"]["primary"]
    assert scored_again["rows"] == union["rows"]
    lean = scored_again["lean_beyond_null"]
    assert lean["datasets"] == [0, 1] and len(lean["per_statistic"]) == 3 * 4
    # a null scored against other references than the export's now is refused
    stale = {**nr, "reference_sha256": {k: "0" * 64 for k in nr["reference_sha256"]}}
    (tmp_path / "stale_null.json").write_text(json.dumps(stale))
    refused = rescored_with(tmp_path / "stale_null.json")
    assert refused.returncode != 0 and "is not the one it was scored against" in refused.stderr



def _blocks_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_power_gpu_blocks", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_checkpoint_is_continued_only_by_a_run_built_from_the_same_arrays_and_options():
    """A resumed run continues chains a stopped process left; chains started from another point,
    over other kept or dense-block parameters, or fitted to other outcomes are another run's, so
    every array the chains are built from changes the run's fingerprint, as every option does."""
    mod = _blocks_script()
    rng = np.random.default_rng(7)
    built = {"Y": rng.normal(size=(3, 40)), "x0": rng.normal(size=12), "keep_idx": np.arange(0, 12, 2),
             "dense_idx": np.arange(4)}
    options = {"block": "primary", "seed": 1, "warmup": 400}
    base = mod.run_fingerprint(b"export", built, **options)
    assert base == mod.run_fingerprint(b"export", {k: v.copy() for k, v in built.items()}, **options)
    for name, a in built.items():
        other = a.copy()
        other.flat[0] = other.flat[0] + 1
        assert mod.run_fingerprint(b"export", {**built, name: other}, **options) != base, name
    # the same numbers split another way (a dense block over the first five, not four) is another run
    assert mod.run_fingerprint(b"export", {**built, "dense_idx": np.arange(5)}, **options) != base
    assert mod.run_fingerprint(b"export", {**built, "Y": built["Y"].reshape(4, 30)}, **options) != base
    assert mod.run_fingerprint(b"export", built, **{**options, "seed": 2}) != base
    assert mod.run_fingerprint(b"another export", built, **options) != base


def test_an_sbc_completes_a_comparison_only_for_the_same_sampler_and_settings(tmp_path):
    """Item 3(b)'s SBC runs on a reduced design, the comparison at registered size: the SBC may
    complete the comparison's verdict only where both ran the same sampler under the same
    registered settings with at least 500 prior draws, and runs of different samplers are never
    scored as one validation."""
    mod = _blocks_script()
    sampler = {"algorithm": "adaptive_hmc_dense_pooled", "chains": 4, "warmup": 400, "draws": 500,
               "target_accept": 0.9}
    top = {"settings_sha256": "a" * 64}
    good = {"frames": 50, "depths": 1, "settings_sha256": "a" * 64, "sampler": {**sampler, "pilot_steps": 1000},
            "sbc": {"complete": True, "prior_draws": 500, "min_p": 0.03, "passed": True}}
    path = tmp_path / "sbc.json"
    path.write_text(json.dumps(good))
    assert mod.sbc_of(path, sampler, top)["passed"] is True
    for change, says in (({"sampler": {**sampler, "target_accept": 0.8}}, "sampler target_accept 0.8"),
                         ({"settings_sha256": "b" * 64}, "settings_sha256 bbbbbbbbbbbb"),
                         ({"sbc": {**good["sbc"], "prior_draws": 499}}, "at least 500 prior draws")):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(SystemExit, match=says):
            mod.sbc_of(path, sampler, top)
    path.write_text(json.dumps(good))
    with pytest.raises(SystemExit, match="record no sampler settings"):
        mod.sbc_of(path, None, top)
    # two runs of disjoint datasets: one with another warm-up is refused; old runs (no sampler) carry none
    for name, first, ran in (("a", 0, sampler), ("b", 2, {**sampler, "warmup": 200}), ("c", 2, None)):
        (tmp_path / name).mkdir()
        extra = {} if ran is None else {"sampler": json.dumps(ran)}
        np.savez(tmp_path / name / "primary.npz", H1=np.zeros((2, 4, 5)), failing=np.zeros(2, dtype=bool),
                 first_dataset=first, **extra)
    with pytest.raises(SystemExit, match="other samplers"):
        mod.saved_runs([tmp_path / "a", tmp_path / "b"], "primary", ["H1"])
    h, failing, numbers, ran = mod.saved_runs([tmp_path / "c", tmp_path / "a"], "primary", ["H1"])
    assert numbers.tolist() == [0, 1, 2, 3] and ran is None and [x.shape for x in h["H1"]] == [(4, 5)] * 4
    # a run whose second dataset was not extended (its row padded with NaN to the extended one's draws),
    # scored with a run of another length
    (tmp_path / "d").mkdir()
    padded = np.zeros((2, 4, 6))
    padded[1, :, 3:] = np.nan
    np.savez(tmp_path / "d" / "primary.npz", H1=padded, failing=np.zeros(2, dtype=bool), first_dataset=4,
             draws_per_dataset=np.array([6, 3]), sampler=json.dumps(sampler))
    h, _, numbers, _ = mod.saved_runs([tmp_path / "d", tmp_path / "a"], "primary", ["H1"])
    assert numbers.tolist() == [0, 1, 4, 5] and [x.shape for x in h["H1"]] == [(4, 5), (4, 5), (4, 6), (4, 3)]
    assert not any(np.isnan(x).any() for x in h["H1"])


def test_a_sampler_passes_at_registered_size_only_where_every_registered_scenario_passed_on_64_datasets(
        tmp_path, settings):
    """Item 3(a): "on at least 64 datasets per scenario". The record a host's
    power_sampler.validation names (``verdict``) passes only where every registered scenario
    passed on 64 datasets, all fitted by one sampler under one set of registered settings; the
    host's check then vouches for exactly that sampler and no other."""
    mod = _blocks_script()
    sampler = {"algorithm": "adaptive_hmc_dense_pooled", "chains": 4, "warmup": 400, "draws": 500,
               "target_accept": 0.9}
    made = iter(range(100))

    def rescored(scenario, datasets=64, parts=(True, 0, 0, True), **changed):
        """A scenario's rescore JSON, its verdict from ``parts`` (``validation.verdict``)."""
        rec = {"scenario": scenario, "datasets": datasets, "max_z": 3.1, "z_bound": validation.z_bound(datasets * 12),
               "label_flips": 0, "verdict": validation.verdict(*parts), "sampler": sampler,
               "settings_sha256": settings.sha256, "frames": 50, "depths": 8, **changed}
        path = tmp_path / f"rescored-{next(made)}.json"
        path.write_text(json.dumps({"blocks": {"primary": rec}}))
        return str(path)

    def joined(*files):
        out = tmp_path / "verdict.json"
        mod.verdict(argparse.Namespace(rescored=list(files), block="primary", json=str(out)))
        return json.loads(out.read_text())

    assert set(settings.power.scenarios) == {"meaningful", "null", "sesoi"}
    ran = SimpleNamespace(**{k: sampler[k] for k in VALIDATED_FIELDS})
    every = joined(*(rescored(s) for s in settings.power.scenarios))
    assert every["passed"] is True and every["verdict"] == {"status": "passed", "passed": True, "reasons": []}
    assert every["datasets"] == 64 and set(every["scenarios"]) == set(settings.power.scenarios)
    assert validation_status(every, ran).status == "passed"
    # a sampler other than the one that ran (another target acceptance): the record vouches for nothing there
    other = dataclasses.replace(settings.simulation_sampler, **{**{k: sampler[k] for k in VALIDATED_FIELDS},
                                                                "target_accept": 0.8})
    assert validation_status(every, other).status == "other_sampler"
    # a scenario passed on 48 datasets is short of item 3(a), not passed
    short = joined(rescored("meaningful", datasets=48), rescored("null"), rescored("sesoi"))
    assert short["verdict"]["status"] == "incomplete" and short["passed"] is False and short["datasets"] == 48
    assert short["verdict"]["reasons"] == ["meaningful: 48 of the 64 datasets a scenario needs"]
    assert validation_status(short, ran).status == "failed"
    assert joined(rescored("meaningful"), rescored("null"))["verdict"]["reasons"] == ["sesoi: not scored"]
    # a scenario whose comparison failed fails the whole, whatever else is short
    failed = joined(rescored("meaningful", datasets=48), rescored("null", parts=(False, 0, 0, True)), rescored("sesoi"))
    assert failed["verdict"]["status"] == "failed"
    assert failed["verdict"]["reasons"][0].startswith("null: the comparison with the reference")
    # refused, naming why: other samplers, settings or designs; a scenario twice; a record written before
    # it named its design
    for files, says in (([rescored("meaningful"), rescored("null", sampler={**sampler, "warmup": 200})], "other samplers"),
                        ([rescored("meaningful"), rescored("null", settings_sha256="b" * 64)], "other registered settings"),
                        ([rescored("meaningful"), rescored("null", frames=40)], "other designs"),
                        ([rescored("null"), rescored("null")], "'null' twice"),
                        ([rescored("null", frames=None)], r"lacks \['frames'\]")):
        with pytest.raises(SystemExit, match=says):
            joined(*files)
