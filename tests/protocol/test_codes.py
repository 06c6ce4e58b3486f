import numpy as np
import pytest
from codecstream.protocol import CodesError, pack_codes, unpack_codes, validate_codes
from hypothesis import given
from hypothesis import strategies as st


def test_codes_round_trip_as_int16_little_endian_frame_major():
    codes = np.arange(32, dtype=np.int16).reshape(2, 16)
    data = pack_codes(codes)
    assert len(data) == 2 * 16 * 2
    assert data[:4] == bytes([0, 0, 1, 0])  # frame 0 codebook 0 = 0, codebook 1 = 1, little-endian
    assert data[32:34] == bytes([16, 0])  # frame 1 starts after 16 codes
    np.testing.assert_array_equal(unpack_codes(data, 2), codes)


def test_out_of_range_code_names_frame_codebook_and_value():
    codes = np.zeros((13, 16), dtype=np.int16)
    codes[12, 3] = 2051
    with pytest.raises(CodesError, match="frame 12 codebook 3 has 2051, codebook size is 2048"):
        pack_codes(codes)


def test_negative_code_is_rejected_on_unpack():
    data = np.full((1, 16), -1, dtype="<i2").tobytes()
    with pytest.raises(CodesError, match="frame 0 codebook 0 has -1"):
        unpack_codes(data, 1)


def test_byte_length_mismatch_states_expected_length():
    with pytest.raises(CodesError, match="byte length 31 does not match 1 frames x 16 codebooks x 2 bytes = 32"):
        unpack_codes(b"\0" * 31, 1)


@pytest.mark.parametrize("bad", [np.zeros((2, 15), np.int16), np.zeros((16,), np.int16), np.zeros((2, 16), np.float32)])
def test_wrong_shape_or_dtype_is_rejected(bad):
    with pytest.raises(CodesError):
        validate_codes(bad)


@given(st.binary(max_size=600), st.integers(min_value=-3, max_value=20))
def test_unpacking_arbitrary_bytes_returns_valid_codes_or_raises_codes_error(data, frames):
    try:
        codes = unpack_codes(data, frames)
    except CodesError:
        return
    assert codes.shape == (frames, 16)
    assert codes.min(initial=0) >= 0 and codes.max(initial=0) < 2048


@given(st.lists(st.lists(st.integers(0, 2047), min_size=16, max_size=16), max_size=40))
def test_any_valid_codes_survive_the_round_trip(rows):
    codes = np.array(rows, dtype=np.int16).reshape(-1, 16)
    np.testing.assert_array_equal(unpack_codes(pack_codes(codes), len(codes)), codes)
