"""Placement by a device map (accelerate): `--device-map` and `--max-memory` parsed exactly or
refused in one line, and the `from_pretrained` keywords that place a model (CPU or disk offload
included)."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile

import torch

from ..engine.placement import DEVICE_MAP_STRATEGIES
from ..errors import ArborError

_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)((?:[kmgt]i?)?b)?")
_SIZE_UNITS = {
    None: 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _accelerators() -> int:
    """GPUs (or other accelerators) torch sees: the integer devices of device
    maps and max_memory."""
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.device_count() if accelerator is not None else torch.cuda.device_count()


def _available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available()
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "is_available") or not backend.is_available():
        return False
    return device.index is None or device.index < backend.device_count()


def check_map_device(value: str | int, option: str = "--device-map") -> str | int:
    """One device of a device map: "cpu", "disk", a GPU index or a torch device name
    that this machine has."""
    text = str(value).strip().lower()
    if text == "disk":
        return text
    if text.isdigit():
        if int(text) >= _accelerators():
            raise ArborError(
                f"{option} names GPU {text} but torch sees {_accelerators()} GPUs here: name "
                "cpu (or disk) instead"
            )
        return int(text)
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ArborError(
            f"{option}: {value!r} is not a device: use cpu, disk, cuda, cuda:N or a GPU index"
        ) from None
    if not _available(device):
        raise ArborError(
            f"{option} names {text} but torch sees no such device here: name cpu (or disk) instead"
        )
    return text


def parse_device_map(spec: str | dict | None) -> str | dict | None:
    """A device map: a strategy (auto, balanced, balanced_low_0, sequential), one device, or
    module=device pairs ("model.layers.0=cpu,lm_head=disk,...", or a dict) as
    transformers takes it."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        return {str(name): check_map_device(device) for name, device in spec.items()}
    text = spec.strip()
    if text in DEVICE_MAP_STRATEGIES:
        return text
    if "=" not in text:
        device = check_map_device(text)
        if device == "disk":
            raise ArborError(
                "--device-map disk: use --device-map auto with --max-memory cpu=SIZE to offload "
                "what does not fit to disk"
            )
        return device
    return parse_device_map(
        dict(
            _pair(item, "--device-map", "MODULE=DEVICE") for item in text.split(",") if item.strip()
        )
    )


def _pair(item: str, option: str, form: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ArborError(
            f"{option}: {item.strip()!r} is not {form}: give comma-separated {form} pairs"
        )
    return key.strip(), value.strip()


def parse_size(value: str | int, option: str = "--max-memory") -> int:
    """Bytes from 123, "500MB", "10GiB", "1.5 GB" (KB/MB/GB/TB powers of 1000,
    KiB/MiB/GiB/TiB of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE.fullmatch(str(value).strip().lower().replace(" ", ""))
    size = (
        float(match[1]) * _SIZE_UNITS[match[2]]
        if match and (match[2] or "." not in match[1])
        else 0
    )
    if size < 1:
        raise ArborError(
            f"{option}: {value!r} is not a memory size: write e.g. 500MB, 10GiB "
            "or a number of bytes"
        )
    return int(size)


def parse_max_memory(spec: str | dict | None) -> dict | None:
    """Per-device memory for the device map: "0=10GiB,cpu=20GiB" -> {0:
    10737418240, "cpu": 21474836480}.

    Devices: GPU indices (also "cuda:N"), "cpu", "mps" and "disk"; sizes as in `parse_size`.
    """
    if spec is None:
        return None
    items = (
        spec.items()
        if isinstance(spec, dict)
        else [
            _pair(item, "--max-memory", "DEVICE=SIZE") for item in spec.split(",") if item.strip()
        ]
    )
    out: dict = {}
    for device, size in items:
        key = check_map_device(str(device).removeprefix("cuda:"), "--max-memory")
        if key not in (*range(_accelerators()), "cpu", "mps", "disk"):
            raise ArborError(f"--max-memory: {device!r} is not a GPU index, cpu, mps or disk")
        out[key] = parse_size(size)
    if not out:
        raise ArborError(
            "--max-memory is empty: give DEVICE=SIZE pairs, e.g. cpu=20GiB or 0=10GiB,cpu=20GiB"
        )
    return out


@functools.cache
def default_offload_folder() -> str:
    """A folder for weights offloaded to disk, made once per process and removed at exit."""
    folder = tempfile.mkdtemp(prefix="arborspec-offload-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def placement_kwargs(
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> dict:
    """`from_pretrained` keywords placing a model by a device map (accelerate); {} for a plain load.

    `max_memory` without a device map means `device_map="auto"`; weights offloaded to disk go
    to `offload_folder` (default: a temporary folder of this process).
    """
    device_map = parse_device_map(device_map)
    max_memory = parse_max_memory(max_memory)
    if device_map is None and max_memory is not None:
        device_map = "auto"
    if device_map is None:
        if offload_folder is not None:
            raise ArborError(
                "--offload-folder needs --device-map or --max-memory (it holds "
                "weights offloaded to disk)"
            )
        return {}
    kwargs = {
        "device_map": device_map,
        "offload_folder": str(offload_folder or default_offload_folder()),
    }
    return kwargs | ({"max_memory": max_memory} if max_memory is not None else {})
