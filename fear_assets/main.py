"""The main job on the embedded family: ``python -m fear_assets.main``.

Materialises every asset that exists so far for the embedded default configuration
through the project's Dagster instance (so the runs, partitions and checks show in the UI)
and prints where the DuckDB file is and how to open the UI.
"""

from __future__ import annotations

import os
import sys
import time

from fear_assets.settings import PROJECT_ROOT


#: The console shows INFO and above (progress of long steps), not Dagster's DEBUG events;
#: everything is still in the instance's event log and the UI.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def _embedded_family(settings) -> str:
    return next(k for k, f in settings.families.items() if f.role == "embedded")


def power_note(settings, family: str) -> str:
    """The power gate's line in the summary (its figures are in the registration record)."""
    from fear_assets.registration.record import read_power_section
    from fear_assets.settings import DEFAULT_REGISTRATION_DIR

    p = read_power_section(DEFAULT_REGISTRATION_DIR, family)
    if not p:
        return ""
    fitted = f"{p['datasets_fitted']} dataset(s), {p['fits']} contrast fits"
    return (f"POWER GATE (6.3) for {family}: {p['note'] or 'registered simulation'}\n  {fitted}; status: {p['status']}; "
            f"frames {p['frames']}; estimation-only: {', '.join(p['estimation_only']) or 'none'}; "
            f"fits missing the convergence rule: {p['fits_missing_convergence_rule']}")


def run(duckdb_path: str | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as steps finish
    os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT))
    os.chdir(PROJECT_ROOT)  # dagster.yaml keeps the instance under ./.dagster
    import dagster as dg

    from fear_assets.definitions import all_assets, all_checks, resources
    from fear_assets.partitions import SETTINGS, registered_partition_keys
    from fear_assets.resources.store import duckdb_path as default_duckdb_path

    db = duckdb_path or default_duckdb_path()
    instance = dg.DagsterInstance.get()
    res = resources(db)
    family = _embedded_family(SETTINGS)
    spec = SETTINGS.family(family)
    everything = [*all_assets, *all_checks]
    started = time.perf_counter()

    def step(label: str, selection: list[str], partition_key: str | None = None) -> dg.ExecuteInProcessResult:
        t = time.perf_counter()
        result = dg.materialize(everything, selection=selection, partition_key=partition_key, instance=instance,
                                resources=res, raise_on_error=False, run_config=QUIET)
        step_failures = [e for e in result.all_events if e.is_step_failure]
        if step_failures:
            # A real failure (not a failed gate, which only skips what it blocks): stop with its message.
            raise SystemExit(f"step failed in {label}: {step_failures[0].event_specific_data.error.message}")
        failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
        print(f"  {label:<34} {time.perf_counter() - t:5.1f} s  run {result.run_id[:8]}"
              + (f"  FAILED CHECKS: {', '.join(e.check_name for e in failed)}" if failed else ""))
        for e in failed:
            print(f"    {e.check_name}: {e.description}")
        return result

    print(f"fear_assets main job: family {family} ({spec.tested})")
    if spec.reduced_design:
        print(f"  REDUCED DESIGN: {spec.reduced_design.reason}")
        print(f"  depths {dict(zip(spec.depth_keys, spec.depth_tokens))} tokens; "
              f"pilot frames {', '.join(spec.reduced_design.pilot_frames)}; "
              f"{spec.reduced_design.confirmatory_frames_per_fear} confirmatory frame(s) per fear; "
              f"scored blocks {', '.join(spec.reduced_design.scored_blocks)}")
    first = step("frame_bank (+ freeze check)", ["frame_bank"])
    if any(not e.passed for e in first.get_asset_check_evaluations()):
        print("The freeze gate failed: nothing downstream runs. See the check's message above.")
        return 2
    from fear_assets.modes import GATES_BLOCK

    def gated(result: dg.ExecuteInProcessResult) -> bool:
        """In confirmatory mode a failed gate stops the job (nothing downstream runs); a
        failure with WARN severity (carried to the reading, e.g. in-context binding) does not."""
        return GATES_BLOCK and any(not e.passed and e.severity == dg.AssetCheckSeverity.ERROR
                                   for e in result.get_asset_check_evaluations())

    depth_keys = registered_partition_keys(SETTINGS, family)
    from fear_assets.assets.simulation import power_partition_keys
    plan: list[tuple[str, list[str], object]] = [
        (f"name_gate {family}", ["name_gate"], family),
        *[(f"trial_table, assignment_key {k}", ["trial_table", "assignment_key"], k) for k in depth_keys],
        (f"trial_accounting {family}", ["trial_accounting"], family),
        (f"model_manifest, sentence_surprisal {family}", ["model_manifest", "sentence_surprisal",
                                                          "base_sentence_surprisal", "judge_sentence_surprisal"], family),
        (f"matched_frames, zero_preference {family}", ["matched_frames", "zero_preference"], family),
        *[(f"scores {k}", ["scores"], k) for k in depth_keys],
        # The depth band reads the resolved mentions of report_scoring (4.5, 5), so it comes first.
        (f"binding_results, report_scoring {family}", ["binding_results", "report_scoring"], family),
        (f"pilot_depths {family}", ["pilot_depths"], family),
        *[(f"pilot_control_scores {k}", ["pilot_control_scores"], k) for k in depth_keys],
        (f"probe_outputs, probe_controls {family}", ["probe_outputs", "probe_controls"], family),
        (f"pilot_controls {family}", ["pilot_controls"], family),
        # 6.3 (issue 11): the power gate, as a REDUCED DEMO simulation (not the registered one).
        (f"power_pilot_estimates {family}", ["power_pilot_estimates"], family),
        *[(f"power_simulation {k.keys_by_dimension['batch']} (demo)", ["power_simulation"], k)
          for k in power_partition_keys(SETTINGS, family)],
        (f"power_summary {family} (demo)", ["power_summary"], family),
        (f"registration_record {family}", ["registration_record"], family),
        (f"h4_posterior {family}", ["h4_posterior"], family),
        (f"posteriors, section8_reading {family}", ["posteriors", "section8_reading"], family),
        ("cross_family_statement", ["cross_family_statement"], None),
        # Issue 15: the Stage 2 report and the data record (Appendix B; Appendix C steps 5, 7).
        (f"stage2_report, data_record {family}", ["stage2_report", "data_record"], family),
        ("stage2_report_all", ["stage2_report_all"], None),
    ]
    ok = True
    for label, selection, key in plan:
        result = step(label, selection, key)
        if label.startswith("trial_accounting"):
            ok = all(e.passed for e in result.get_asset_check_evaluations())
        if gated(result):
            print(f"Confirmatory mode: a registration gate failed in {label}; nothing downstream runs.")
            return 2

    import duckdb

    with duckdb.connect(db, read_only=True) as con:
        n = con.execute("select count(*) from two_facts_one_gate.trial_table where family = ?", [family]).fetchone()[0]
        blocks = con.execute("select count(distinct block) from two_facts_one_gate.trial_table where family = ?",
                             [family]).fetchone()[0]
        scored = con.execute("select block, count(*) as trials, round(avg(delta), 4) as mean_delta, "
                             "round(avg(fc_correct::int), 3) as fc_accuracy, sum(excluded_context::int) as excluded "
                             "from two_facts_one_gate.scores where family = ? group by block order by block",
                             [family]).df()
        h4 = con.execute("select frame_set, round(mean, 3) as mean, round(hdi_low, 3) as hdi_low, "
                         "round(hdi_high, 3) as hdi_high, label, flags from two_facts_one_gate.h4_posterior "
                         "where family = ?", [family]).df()
        gates = con.execute("select gate, passed, numbers from two_facts_one_gate.registration_record "
                            "where family = ?", [family]).df()
        estimands = con.execute("select contrast, kind, status, round(mean, 3) as mean, round(hdi_low, 3) as hdi_low, "
                                "round(hdi_high, 3) as hdi_high, label, convergence_problems = '' as converged "
                                "from two_facts_one_gate.posteriors where family = ? and kind in "
                                "('confirmatory', 'gate', 'control')", [family]).df()
        reading = con.execute("select * from two_facts_one_gate.section8_reading where family = ?", [family]).df()
        record_path = con.execute("select any_value(record_path) from two_facts_one_gate.registration_record "
                                  "where family = ?", [family]).fetchone()[0]
    print(f"\nDone in {time.perf_counter() - started:.0f} s: {n} trials in {blocks} blocks for {family}; "
          f"accounting {'closed' if ok else 'NOT closed'}.")
    print("Scored (pilot, masked cells pooled):")
    print(scored.to_string(index=False))
    print(f"Registration gates (record: {record_path}, Markdown beside it):")
    print(gates.to_string(index=False))
    print("H4 (carriage, probe log-odds, 99% HDI):")
    print(h4.to_string(index=False))
    print("Confirmatory estimands, gates and controls (99% HDI):")
    print(estimands.to_string(index=False))
    r = reading.iloc[0]
    print(f"\nSECTION 8 READING for {family}: {r['code']} (decision table row {r['row']})")
    print(f"  labels: H2 {r['h2']}, H5 {r['h5']}, gate (a) {r['gate_a']}, gate (b) {r['gate_b']}, gate (c) {r['gate_c']}")
    print(f"  qualifiers: {r['qualifiers'] or 'none'}")
    print(f"  flags: {r['flags'] or 'none'}")
    power = power_note(SETTINGS, family)
    if power:
        print(power)
    print(f"Stage 2 report: {PROJECT_ROOT / 'data' / 'reports' / family / 'stage2_report.html'} (issue 15)")
    print(f"DuckDB file: {db}")
    print(f"  inspect:  .venv/bin/python -c \"import duckdb; print(duckdb.connect('{db}', read_only=True)"
          ".sql('select block, count(*) from two_facts_one_gate.trial_table group by 1'))\"")
    print("Dagster UI (asset graph, partitions, checks, run history):")
    print(f"  cd {PROJECT_ROOT} && bash scripts/fear ui   # then open http://127.0.0.1:3000")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1] if len(sys.argv) > 1 else None))
