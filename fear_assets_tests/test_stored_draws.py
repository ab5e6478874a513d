"""Stored posterior draws: the same draws give the same file bytes, so the sha256 that the
posteriors tables keep beside each file is reproducible ("the same inputs give byte-identical
tables"); ArviZ stamps every group with its creation time, which would change it per run."""

import time

import arviz as az
import numpy as np

from fear_assets.core.hashing import sha256_file, write_inference_data


def _idata():
    rng = np.random.default_rng(3)
    return az.from_dict(posterior={"beta": rng.normal(size=(2, 50, 3))},
                        sample_stats={"diverging": np.zeros((2, 50), dtype=bool)})


def test_the_same_draws_give_the_same_bytes(tmp_path):
    first = write_inference_data(_idata(), tmp_path / "a.nc")
    time.sleep(1.1)  # a later creation time, which ArviZ would stamp into the file
    second = write_inference_data(_idata(), tmp_path / "b.nc")
    assert sha256_file(first) == sha256_file(second)
    assert not list(tmp_path.glob("*.tmp"))
    back = az.from_netcdf(first)
    np.testing.assert_array_equal(back.posterior["beta"].values, _idata().posterior["beta"].values)
    # other draws, other bytes: the hash still tells files apart
    other = _idata()
    other.posterior["beta"] = other.posterior["beta"] + 1.0
    assert sha256_file(write_inference_data(other, tmp_path / "c.nc")) != sha256_file(first)
