"""The radix sort against numpy's stable sort, for any number of parallel runs."""

import numpy as np
import pytest

from splatscale.render.radix_sort import _radix_sort, stable_sort


def keys_of(kind: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "depths":  # float32 depths' bit patterns
        return (rng.random(count, np.float32) * 10 + 0.1).view(np.int32)
    if kind == "ties":
        return rng.integers(0, 5, count).astype(np.int32)
    if kind == "one key":  # every pass skipped
        return np.full(count, 7, np.int32)
    # the largest keys: the top digit's every bit
    return rng.integers(2**31 - 3000, 2**31 - 1, count, endpoint=True).astype(np.int32)


@pytest.mark.parametrize("count", [0, 1, 2, 5, 1000, 70001])
@pytest.mark.parametrize("kind", ["depths", "ties", "one key", "largest"])
def test_radix_sort_is_numpys_stable_sort(count, kind):
    keys = keys_of(kind, count, np.random.default_rng(count))
    expected = np.argsort(keys, kind="stable")
    for parts in (1, 2, 3, 7):
        values, order = _radix_sort(keys, parts)
        assert values.dtype == np.int32 and order.dtype == np.int64
        np.testing.assert_array_equal(order, expected, err_msg=f"{parts} runs")
        np.testing.assert_array_equal(values, keys[expected], err_msg=f"{parts} runs")
    np.testing.assert_array_equal(stable_sort(keys)[1], expected)


def test_only_int32_keys_are_taken():
    with pytest.raises(TypeError, match="int32"):
        stable_sort(np.arange(4, dtype=np.int64))
