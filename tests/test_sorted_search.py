"""The compiled binary search against numpy's searchsorted."""

import numpy as np

from splatscale.render.sorted_search import first_at_least


def test_the_first_index_at_least_a_value_is_numpys_searchsorted():
    ascending = np.array([0, 0, 3, 3, 3, 7, 12], np.int64)
    for value in [-1.0, 0.0, 0.5, 3.0, 3.2, 7.0, 11.9, 12.0, 12.5]:
        assert first_at_least(ascending, value) == np.searchsorted(ascending, value), value
    assert first_at_least(np.empty(0, np.int64), 1.0) == 0
