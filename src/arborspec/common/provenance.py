"""What every file a tool writes records about where it was made: the machine, the
versions and the time; and what the CPU can do (`cpu_flags`, which picks the int8 kernels)."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime

import torch

__version__ = "0.1.0"  # arborspec's version (re-exported as `arborspec.__version__`)


def machine_info(device: torch.device | str | None = None) -> dict:
    """Platform, CPU, torch threads and GPU; `device` too when given."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    if device is not None:
        info["device"] = str(device)
    return info


def cpu_model() -> str:
    """The CPU's model name where the OS tells it (Linux: /proc/cpuinfo), else ""."""
    return _cpuinfo("model name")


def cpu_flags() -> set[str]:
    """The CPU's feature flags where the OS tells them (Linux: /proc/cpuinfo), else none."""
    return set(_cpuinfo("flags").split())


def _cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo, else ""."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def stamp() -> dict:
    """When, on what and with which versions a measurement was made: `measured`, `machine`,
    `versions`, for a tool's JSON file."""
    return {"measured": utc_timestamp(), "machine": machine_info(), "versions": versions()}


def versions() -> dict:
    """arborspec, torch and transformers versions."""
    import transformers

    return {
        "arborspec": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def utc_timestamp() -> str:
    """Now, in UTC, to the second (ISO 8601)."""
    return datetime.now(UTC).isoformat(timespec="seconds")
