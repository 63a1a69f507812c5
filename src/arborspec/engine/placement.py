"""Where a model loaded with a device map runs and keeps its weights (accelerate's hooks,
CPU and disk offload).

A model loaded with `from_pretrained(device_map=...)` over more than one device (or with
"disk" in its map) carries accelerate hooks (`module._hf_hook`): every hooked module runs
on its hook's *execution device*, and a module offloaded to the CPU (on a GPU machine) or
to the disk keeps its weights on the `meta` device, materialised only inside its own
forward. So inputs go to the model's execution device (not `model.device`, which is
`meta` when the first weights are offloaded), and code that reads a weight outside a
forward must fetch it from the hook's offloaded weights (`materialised`).
"""

from __future__ import annotations

import torch

from ..errors import ArborError

# the placement strategies of a device map (accelerate), beside explicit module=device maps
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def hook_of(module: torch.nn.Module):
    """The module's accelerate device hook (the first one in a chain of hooks), or None."""
    hook = getattr(module, "_hf_hook", None)
    for one in [hook, *getattr(hook, "hooks", ())]:
        if hasattr(one, "execution_device"):
            return one
    return None


def execution_device(module: torch.nn.Module) -> torch.device:
    """Where the module computes: its hook's execution device, else the device
    of its first weight."""
    hook = hook_of(module)
    if hook is not None and hook.execution_device is not None:
        return torch.device(hook.execution_device)
    return next(module.parameters()).device


def is_offloaded(module: torch.nn.Module) -> bool:
    """True when the module's weights live outside it (a hook with offload, or
    weights on `meta`)."""
    hook = hook_of(module)
    if hook is not None and getattr(hook, "offload", False):
        return True
    return any(p.device.type == "meta" for p in module.parameters(recurse=False))


def materialised(module: torch.nn.Module, name: str = "weight") -> torch.Tensor:
    """The tensor `module.<name>` holds (None if it has none), fetched from the hook's offloaded
    weights when on `meta`."""
    tensor = getattr(module, name, None)
    if tensor is None or tensor.device.type != "meta":
        return tensor
    hook = hook_of(module)
    weights = getattr(hook, "weights_map", None)
    if weights is None:
        raise ArborError(
            f"{type(module).__name__}.{name} is on the meta device with no offloaded copy: "
            "load the model with a device map that gives it a device, cpu or disk"
        )
    return weights[name].to(tensor.dtype)
