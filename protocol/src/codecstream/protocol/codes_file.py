"""Codes files: recorded streams for replay, parity and QA.

A `.npy` file holds one int16 array of shape (frames, 16). A `.npz` file holds `codes` and, for
voice-clone streams, `reference_codes` (the frames that prime the decoder and are not played).
"""

from __future__ import annotations

import dataclasses
import pathlib
import zipfile

import numpy as np
from codecstream.protocol.codes import validate_codes
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.protocol.errors import CodesError


@dataclasses.dataclass(frozen=True)
class CodesFile:
    codes: np.ndarray
    reference_codes: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
    )


def save_codes_file(path: pathlib.Path | str, codes: np.ndarray, reference_codes: np.ndarray | None = None) -> None:
    path = pathlib.Path(path)
    validate_codes(codes)
    if path.suffix == ".npy":
        if reference_codes is not None and len(reference_codes):
            raise CodesError(f"{path}: reference codes need a .npz file")
        np.save(path, codes.astype(np.int16))
        return
    if path.suffix != ".npz":
        raise CodesError(f"{path}: codes files end in .npy or .npz")
    reference = np.zeros((0, codes.shape[1]), dtype=np.int16) if reference_codes is None else reference_codes
    validate_codes(reference)
    np.savez(path, codes=codes.astype(np.int16), reference_codes=reference.astype(np.int16))


def load_codes_file(path: pathlib.Path | str) -> CodesFile:
    """Read and validate a codes file; CodesError says what is wrong with it."""
    path = pathlib.Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CodesError(f"{path}: no such codes file") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise CodesError(f"{path}: not a .npy/.npz codes file ({error})") from None
    if isinstance(loaded, np.ndarray):
        codes, reference = loaded, np.zeros((0, loaded.shape[-1] if loaded.ndim == 2 else 16), dtype=np.int16)
    else:
        with loaded:
            if "codes" not in loaded.files:
                raise CodesError(f"{path}: .npz codes file has no 'codes' array (has {sorted(loaded.files)})")
            codes = loaded["codes"]
            reference = (
                loaded["reference_codes"]
                if "reference_codes" in loaded.files
                else np.zeros((0, NUM_CODEBOOKS), np.int16)
            )
    for name, array in (("codes", codes), ("reference_codes", reference)):
        try:
            validate_codes(array)
        except CodesError as error:
            raise CodesError(f"{path}: {name}: {error}") from None
    return CodesFile(codes.astype(np.int16), reference.astype(np.int16))
