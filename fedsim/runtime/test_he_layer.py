"""The HE layer's flat vector (what CKKS encrypts) gives back the named arrays it was made of, and
refuses a vector of another model's size (``tests/test_he_layer.py`` runs the layer itself)."""

import numpy as np
import pytest

from fedsim.runtime.he_layer import flatten, unflatten


def test_a_flat_vector_unflattens_to_the_arrays_it_was_made_of():
    arrays = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([0.5], dtype=np.float32),
    }
    back = unflatten(flatten(arrays), arrays)
    assert list(back) == list(arrays)
    assert all(
        np.array_equal(back[k], arrays[k]) and back[k].dtype == arrays[k].dtype for k in arrays
    )
    with pytest.raises(ValueError, match="7 values, model needs 6"):
        unflatten(np.zeros(7), {"w": arrays["w"]})
