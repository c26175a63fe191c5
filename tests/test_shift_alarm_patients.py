"""The patient-level shift alarm (`shift_alarm.patient_test`) against the beat-level one (`mmd_test`) on generated
patients: items cluster by patient (a per-patient mean offset plus within-patient noise), so new patients of the
same population are no shift, and a site whose patients are all moved is one."""

import numpy as np
import pytest
from scipy.stats import binom

from workbench.clinical.shift_alarm import ALPHA, _subsets, mmd_test, patient_test

D = 8
DRAWS = 200
#: Most rejections out of `DRAWS` independent null draws of a test whose P(p ≤ α) ≤ α (binomial 99.9 % point).
MOST_FALSE = int(binom.ppf(0.999, DRAWS, ALPHA))


def _patients(rng: np.random.Generator, patients: int, items: int, shift: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``patients × items`` rows (d = `D`): patient mean ``shift + N(0, I)``, item ``mean + N(0, I)``; and ids."""
    means = shift + rng.normal(size=(patients, 1, D))
    features = (means + rng.normal(size=(patients, items, D))).reshape(-1, D)
    return features, np.repeat(np.arange(patients), items)


def _case(seed: int, shift: float = 0.0) -> tuple[np.ndarray, ...]:
    """Reference: 10 training patients × 30 items; pool: 60 held-out patients × 20; batch: 4 new patients × 8."""
    rng = np.random.default_rng(seed)
    reference, _ = _patients(rng, 10, 30)
    pool, pool_groups = _patients(rng, 60, 20)
    batch, batch_groups = _patients(rng, 4, 8, shift)
    return reference, batch, batch_groups, pool, pool_groups


def test_new_patients_of_the_same_population_keep_the_level_where_the_beat_level_test_does_not():
    patient_false = beat_false = 0
    for seed in range(DRAWS):
        reference, batch, batch_groups, pool, pool_groups = _case(seed)
        patient_false += patient_test(reference, batch, batch_groups, pool, pool_groups, draws=100,
                                      seed=seed)["p_value"] <= ALPHA  # fmt: skip
        beat_false += mmd_test(reference, batch, permutations=100, seed=seed)["p_value"] <= ALPHA
    assert patient_false <= MOST_FALSE, f"patient_test: {patient_false} of {DRAWS} null batches flagged"
    assert beat_false > MOST_FALSE, f"mmd_test flagged only {beat_false} of {DRAWS}: the clustering is too weak"


def test_a_moved_site_is_flagged():
    flagged = 0
    for seed in range(50):
        reference, batch, batch_groups, pool, pool_groups = _case(1000 + seed, shift=1.5)
        result = patient_test(reference, batch, batch_groups, pool, pool_groups, draws=100, seed=seed)
        flagged += result["verdict"] == "shift"
    assert flagged >= 45, f"only {flagged} of 50 shifted batches flagged"


def test_statistic_is_the_mmd_at_the_reference_bandwidth_and_the_p_value_is_a_rank():
    reference, batch, batch_groups, pool, pool_groups = _case(7)
    result = patient_test(reference, batch, batch_groups, pool, pool_groups, draws=99, seed=3)

    def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        squared = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
        return np.exp(-squared / (2 * result["bandwidth"] ** 2))

    expected = kernel(reference, reference).mean() + kernel(batch, batch).mean() - 2 * kernel(reference, batch).mean()
    distances = np.sqrt(((reference[:, None] - reference[None]) ** 2).sum(axis=2))[np.triu_indices(len(reference), 1)]
    assert result["bandwidth"] == pytest.approx(np.sqrt(np.median(distances**2)), rel=1e-9)
    assert result["statistic"] == pytest.approx(expected, rel=1e-9)
    assert 1 / 100 <= result["p_value"] <= 1 and round(result["p_value"] * 100, 9) % 1 == 0
    assert result["null"] == "held-out patients" and result["pool_patients"] == 60
    assert result["item_draws"] == "without replacement"
    assert (result["reference"], result["batch"]) == (300, 32)
    assert patient_test(reference, batch, batch_groups, pool, pool_groups, draws=99, seed=3) == result


def test_p_value_ends():
    reference, _, _, pool, pool_groups = _case(11)
    far = np.full((6, D), 50.0) + np.random.default_rng(0).normal(size=(6, D))
    assert patient_test(reference, far, np.arange(6) % 2, pool, pool_groups, draws=49)["p_value"] == 1 / 50
    same = np.zeros((20, D))  # every null item equals the batch's: every pseudo-batch ties the observed statistic
    assert patient_test(reference, same[:4], np.zeros(4), same, np.arange(20) % 5, draws=49)["p_value"] == 1.0


def test_a_batch_as_large_as_the_pool_meets_a_varied_null_and_keeps_its_level():
    """One item per patient (one record each): the batch's patients join the pool's in the draw, so a batch of 12
    patients against a pool of 12 is a permutation test of patients, exact, not the one pseudo-batch the pool alone
    could give (its p-value would then be 1/(B+1) or 1)."""
    flagged, p_values = 0, set()
    for seed in range(DRAWS):
        rng = np.random.default_rng(5000 + seed)
        reference, _ = _patients(rng, 10, 30)
        pool, pool_groups = _patients(rng, 12, 1)
        batch, batch_groups = _patients(rng, 12, 1)
        result = patient_test(reference, batch, batch_groups, pool, pool_groups, draws=100, seed=seed)
        flagged += result["p_value"] <= ALPHA
        p_values.add(result["p_value"])
    assert flagged <= MOST_FALSE, f"{flagged} of {DRAWS} null batches flagged"
    assert len(p_values) > 20  # a varied null: many distinct p-values
    one_patient = patient_test(reference, batch, np.zeros(len(batch)), pool, pool_groups, draws=50)  # 12 > 1 item
    assert one_patient["item_draws"] == "with replacement"


def test_too_few_and_bad_input():
    reference, batch, batch_groups, pool, pool_groups = _case(2)
    few = patient_test(reference, batch[:2], batch_groups[:2], pool, pool_groups)
    assert few["verdict"] == "too few" and few["p_value"] is None and few["statistic"] is None
    one = patient_test(reference, batch, batch_groups, pool[pool_groups == 0], pool_groups[pool_groups == 0])
    assert one["verdict"] == "too few" and one["pool_patients"] == 1
    assert patient_test(reference[:1], batch, batch_groups, pool, pool_groups)["verdict"] == "too few"
    with pytest.raises(ValueError, match="batch_groups has 31 ids for 32 batch items"):
        patient_test(reference, batch, batch_groups[:-1], pool, pool_groups)
    with pytest.raises(ValueError, match="one d"):
        patient_test(reference, batch[:, :4], batch_groups, pool, pool_groups)


def test_subsets_are_distinct_and_uniform():
    sizes = np.full((4000, 2), 6)
    drawn = _subsets(sizes, 4, np.random.default_rng(0))
    assert drawn.shape == (4000, 2, 4) and drawn.min() == 0 and drawn.max() == 5
    assert all(len(set(row)) == 4 for row in drawn.reshape(-1, 4))
    shares = np.bincount(drawn.ravel(), minlength=6) / drawn.size
    assert np.abs(shares - 1 / 6).max() < 0.01  # 32,000 positions: sd of a share ≈ 0.002
