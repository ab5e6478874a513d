"""Which sampler fits a power-simulation batch (6.3; the registered simulation sampler and its
validation): the host's choice, a GPU, and a validation of exactly the registered settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fear_assets.core.errors import InputError
from fear_assets.core.site import SiteError, load_site, parse_site
from fear_assets.defs.resources.power import PowerSamplerResource
from fear_assets.simulation.sampler_path import ACCELERATOR, NUTPIE_LOOP, choose_path, validation_status


def _record(sampler, passed: bool, **changed) -> dict:
    """A validation JSON as ``benchmarks/power_gpu.py validate`` writes it, of ``sampler``'s
    settings (``changed``: fields run with other values)."""
    ran = {**dataclasses.asdict(sampler), **changed}
    return {"sampler": ran, "passed": passed, "datasets": 64, "frames": 50, "depths": 8,
            "verdict": {"status": "passed" if passed else "failed",
                        "reasons": [] if passed else ["2 candidate datasets miss the convergence rule"]}}


def test_auto_takes_the_accelerator_path_only_with_a_gpu_and_a_passed_validation(settings):
    s = settings.simulation_sampler
    passed = validation_status(_record(s, True), s)
    failed = validation_status(_record(s, False), s)
    none = validation_status(None, s)
    assert (passed.status, failed.status, none.status) == ("passed", "failed", "none")
    assert "convergence rule" in failed.detail
    assert choose_path("auto", "gpu", passed, confirmatory=True).path == ACCELERATOR
    # a GPU without a passed validation, or a passed validation without a GPU: the nutpie loop, saying why
    for platform, status, why in (("gpu", failed, "has not passed"), ("gpu", none, "has not passed"),
                                  ("cpu", passed, "no GPU")):
        route = choose_path("auto", platform, status, confirmatory=False)
        assert route.path == NUTPIE_LOOP and why in route.reason
    assert choose_path("nutpie", "gpu", passed, confirmatory=True).path == NUTPIE_LOOP


def test_a_validation_of_other_settings_vouches_for_nothing(settings):
    """The validation must have run the registered simulation sampler: a run with another
    warm-up, algorithm, chain count or target acceptance (a divergence-prone 0.8 for the
    registered 0.9) passed for a sampler the simulation would not run."""
    s = settings.simulation_sampler
    for changed in ({"warmup": s.warmup + 200}, {"algorithm": "adaptive_hmc_dense"}, {"chains": s.chains + 1},
                    {"target_accept": round(s.target_accept - 0.1, 6)}):
        status = validation_status(_record(s, True, **changed), s)
        assert status.status == "other_sampler" and next(iter(changed)) in status.detail
        assert choose_path("auto", "gpu", status, confirmatory=False).path == NUTPIE_LOOP


def test_a_registered_family_cannot_force_an_unvalidated_accelerator_path(settings):
    s = settings.simulation_sampler
    failed = validation_status(_record(s, False), s, "v.json", "ab" * 32)
    with pytest.raises(InputError, match="power_sampler.*path.*validation has not passed") as err:
        choose_path("accelerator", "cpu", failed, confirmatory=True, site_file="site.yaml")
    assert "site.yaml" in str(err.value) and "point power_sampler.validation" in err.value.fix
    # a pilot family may force it (a CPU, a test); the batch records the failed validation
    route = choose_path("accelerator", "cpu", failed, confirmatory=False)
    assert route.accelerated and "failed" in route.validation.as_text() and "v.json" in route.validation.as_text()
    with pytest.raises(InputError, match="unknown path 'gpu'"):
        choose_path("gpu", "gpu", failed, confirmatory=False)


def test_the_site_names_the_path_and_its_validation_file(tmp_path, settings):
    site = tmp_path / "site.yaml"
    parsed = parse_site(site, {"power_sampler": {"path": "accelerator", "validation": "results/v.json"}})
    assert parsed.power_sampler.path == "accelerator"
    assert parsed.power_sampler.validation == (tmp_path / "results" / "v.json").resolve()
    assert parse_site(site, {}).power_sampler.path == "auto"
    for raw, field in (({"path": "gpu"}, "path"), ({"validaton": "v.json"}, "validaton"), ("auto", "power_sampler")):
        with pytest.raises(SiteError) as err:
            parse_site(site, {"power_sampler": raw})
        assert err.value.field == field
    # the resource reads the file the site names and records its digest
    v = tmp_path / "results" / "v.json"
    v.parent.mkdir()
    v.write_text(json.dumps(_record(settings.simulation_sampler, True)))
    resource = PowerSamplerResource.from_site(parsed)
    status = resource.validation(settings.simulation_sampler)
    assert status.passed and status.file == str(v) and len(status.sha256) == 64
    v.write_text("{not json")
    with pytest.raises(InputError, match="cannot read the validation file") as err:
        resource.validation(settings.simulation_sampler)
    assert str(site) in str(err.value)
    # the host chose the nutpie loop: JAX is not asked
    assert PowerSamplerResource(path="nutpie").platform() == ""


def test_the_example_site_names_a_passed_validation_of_the_registered_sampler(settings):
    """A GPU host that starts from the example site configuration gets the accelerator path
    only if the record it names vouches for exactly the registered simulation_sampler: it must
    have passed on 64 datasets of every registered scenario (item 3(a)), under these settings'
    design, with the sampler the settings register."""
    example = Path(__file__).resolve().parents[1] / "deploy" / "site.example.yaml"
    resource = PowerSamplerResource.from_site(load_site(example, registered_checkpoints=settings.models))
    status = resource.validation(settings.simulation_sampler)
    assert status.passed, status.as_text()
    record = json.loads(Path(status.file).read_text())
    assert set(record["scenarios"]) == set(settings.power.scenarios)
    assert all(s["status"] == "passed" and s["datasets"] >= 64 for s in record["scenarios"].values())
    assert choose_path("auto", "gpu", status, confirmatory=True).path == ACCELERATOR
