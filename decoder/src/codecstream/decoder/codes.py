"""Codes at the decoder's boundary: checked by the protocol's rules, then made an int64 batch of one."""

from __future__ import annotations

import numpy as np
import torch
from codecstream.protocol.codes import validate_codes
from codecstream.protocol.errors import CodesError


def codes_to_tensor(codes: np.ndarray | torch.Tensor, num_quantizers: int, codebook_size: int) -> torch.Tensor:
    """(k, Q) or (1, k, Q) integer codes -> int64 tensor (1, k, Q); raises CodesError naming the bad value."""
    array = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.dtype.kind not in "iu":
        raise CodesError(f"codes must be integers, got dtype {array.dtype}")
    validate_codes(array, num_quantizers, codebook_size)
    return torch.from_numpy(array.astype(np.int64)).unsqueeze(0)
