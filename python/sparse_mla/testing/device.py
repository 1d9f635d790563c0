"""Whether this process can run the kernel: what examples and scripts check before touching CUDA."""

from __future__ import annotations

import torch


def missing_sm90_gpu() -> str | None:
    """Why the kernel cannot run here (no CUDA device, or the current one is not SM90), or None when it can.

    Lets a script say so and exit cleanly on a host without a Hopper GPU instead of failing on its first
    CUDA tensor.
    """
    if not torch.cuda.is_available():
        return "no CUDA device is visible (sparse_mla runs on SM90 GPUs: H100, H200, H800, H20)"
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        name = torch.cuda.get_device_name()
        return f"{name} (compute capability {capability[0]}.{capability[1]}) is not an SM90 (Hopper) GPU"
    return None
