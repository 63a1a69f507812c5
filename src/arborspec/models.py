"""Loading target and draft models: Hugging Face ids, local directories, the embedded
pair, and the pair itself.

The built-in names (`embedded`, `gemma3-270m`, `qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`) and
`*.gguf` paths resolve to directories converted once into the cache (`catalog.py`). The embedded
draft is the small model distilled for the embedded target (see `arborspec distill`), shipped
inside this package; the shipped draft heads are `embedded-head` and `gemma3-270m-head`.

`load_pair` loads a target (wrapped in its adapter), a drafter and the
tokenizer: the one entry point of the API, the CLI, the offline tools and the
benchmark.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .catalog import (
    BUILTIN_DIRS,
    BUILTIN_DRAFTS,
    BUILTIN_TARGETS,
    EMBEDDED_TARGET,
    GEMMA3_TARGET,
    cache_root,
    gguf_file_dir,
    is_gguf_path,
    parted_installed,
)
from .common.chat import encode_prompt
from .common.vocab import check_same_tokenizer, check_vocab_size
from .drafters import Drafter, DraftHead, HeadDrafter, ModelDrafter, NgramDrafter, load_head
from .drafters.draft_vocab import frequent_tokens
from .engine.adapter import ModelAdapter
from .engine.int8 import Int8GroupMember, Int8Linear, quantize_int8
from .errors import ArborError

EMBEDDED_DRAFT = "embedded-draft"
NGRAM_DRAFT = "ngram"
SHIPPED_DRAFT_DIR = Path(__file__).parent / "assets" / "smollm2-draft"
EMBEDDED_HEAD = "embedded-head"
SHIPPED_HEAD_DIR = Path(__file__).parent / "assets" / "smollm2-head"
GEMMA3_HEAD = "gemma3-270m-head"
SHIPPED_GEMMA3_HEAD_DIR = Path(__file__).parent / "assets" / "gemma3-270m-head"
# draft-head names -> (shipped directory, the draft to use instead when it is missing)
SHIPPED_HEADS = {
    EMBEDDED_HEAD: (SHIPPED_HEAD_DIR, "embedded-draft"),
    GEMMA3_HEAD: (SHIPPED_GEMMA3_HEAD_DIR, NGRAM_DRAFT),
}


def is_head_dir(name: str) -> bool:
    """A draft-head directory (head.json + head.safetensors, see `arborspec train-head`), or the
    name of a shipped head (`embedded-head`, `gemma3-270m-head`)."""
    if name in SHIPPED_HEADS:
        return True
    path = Path(name).expanduser()
    return (path / "head.json").is_file()


def resolve_head_dir(name: str) -> Path:
    if name in SHIPPED_HEADS:
        folder, instead = SHIPPED_HEADS[name]
        if not (folder / "head.json").is_file():
            raise ArborError(
                f"the shipped draft head is missing from {folder}: reinstall arborspec "
                f"or use --draft {instead}"
            )
        return folder
    return Path(name).expanduser()


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


INT8 = "int8"  # the batch-invariant int8 target for CPU (engine/int8.py)


def is_int8(name: str | torch.dtype) -> bool:
    return isinstance(name, str) and name.lower() == INT8


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """The floating dtype of a precision name; `int8` -> float32 (its activations, norms,
    caches and drafts)."""
    if isinstance(name, torch.dtype):
        return name
    if is_int8(name):
        return torch.float32
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ArborError(
            f"unknown dtype {name!r}: use one of float32, float16, bfloat16, int8 (CPU)"
        ) from None


def check_precision(
    dtype: str | torch.dtype, device: str | torch.device, placement: dict | None = None
) -> None:
    """A known precision that this device can run (one-line ArborError otherwise)."""
    parse_dtype(dtype)
    if is_int8(dtype) and (placement or torch.device(device).type != "cpu"):
        raise ArborError(
            "--dtype int8 runs on CPU only (fbgemm kernels), without a device map: "
            "use --device cpu, or float16/bfloat16 on a GPU"
        )


def draft_precision(name: str | torch.dtype) -> str | torch.dtype:
    """The precision a draft model runs in next to a target of precision `name`
    (int8 targets: float32 drafts)."""
    return "float32" if is_int8(name) else name


def int8_calibration_samples(tokenizer) -> list[torch.Tensor]:
    """The built-in calibration text (assets/int8/calibration.txt), one
    chat-formatted sample per block."""
    text = (Path(__file__).parent / "assets" / "int8" / "calibration.txt").read_text(
        encoding="utf-8"
    )
    samples = []
    for block in text.split("\n===\n"):
        user, _, answer = block.strip().partition("\n")
        ids = (
            encode_prompt(tokenizer, user)
            + tokenizer(answer, add_special_tokens=False)["input_ids"]
        )
        samples.append(torch.tensor(ids, dtype=torch.long))
    return samples


def parse_device(name: str | torch.device) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ArborError("--device cuda was asked for but no CUDA GPU is visible: use --device cpu")
    return device


# ----------------------------------------------------------------- placement (device maps, offload)
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
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




def resolve_model_path(name: str) -> str:
    """Map the built-in model names to directories (`BUILTIN_TARGETS`, converted on first use,
    and the shipped draft); check that a local path exists."""
    if name in BUILTIN_TARGETS:
        return str(BUILTIN_TARGETS[name]())
    if is_gguf_path(name):
        return str(gguf_file_dir(name))
    if name == EMBEDDED_DRAFT:
        if not (SHIPPED_DRAFT_DIR / "config.json").is_file():
            raise ArborError(
                f"the shipped draft model is missing from {SHIPPED_DRAFT_DIR}: reinstall arborspec "
                "or use --draft ngram"
            )
        return str(SHIPPED_DRAFT_DIR)
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or path.exists() or name.count("/") > 1
    if looks_local and not path.exists():
        raise ArborError(
            f"model path {name!r} does not exist: give a local HF model directory or a hub id"
        )
    if path.exists() and not (path / "config.json").is_file():
        raise ArborError(f"{name!r} has no config.json: it is not a Hugging Face model directory")
    return str(path) if path.exists() else name


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ArborError(
            f"cannot load a tokenizer for {name!r} ({_first_line(exc)}): check the id or path"
        ) from None


def load_model(
    name: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
):
    """Load an unmodified HF causal LM in eval mode.

    `device_map` / `max_memory` / `offload_folder` (see `placement_kwargs`) place it with
    accelerate, possibly offloaded to the CPU or disk; they override `device`.
    """
    from transformers import AutoModelForCausalLM

    placement = placement_kwargs(device_map, max_memory, offload_folder)
    check_precision(dtype, device, placement)
    int8 = is_int8(dtype)
    path = resolve_model_path(name)
    kernel = attention_kernel(path)
    kwargs = {"dtype": parse_dtype(dtype), "attn_implementation": kernel, **placement}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ArborError(
            f"cannot load model {name!r} ({_first_line(exc)}): check the id or path (offline: "
            "use a local directory)"
        ) from None
    except (ValueError, KeyError, AssertionError, RuntimeError) as exc:
        if not placement:
            raise
        raise ArborError(
            f"cannot place model {name!r} by this device map ({_first_line(exc)}): "
            "check --device-map and --max-memory"
        ) from None
    if not placement:
        model = model.to(parse_device(device))
    model.eval()
    if int8:
        if getattr(model.config.get_text_config(decoder=True), "attn_logit_softcapping", None):
            raise ArborError(
                f"--dtype int8 runs its own attention, without {type(model).__name__}'s attention "
                "logit soft-capping: use --dtype float32"
            )
        quantize_int8(model, int8_calibration_samples(load_tokenizer(name)))
    return model


def attention_kernel(path: str) -> str:
    """The attention implementation to load the model at `path` with: `sdpa`, or `eager` for a
    model class that has no sdpa path (Gemma 2: its attention logits are soft-capped). Both take
    the adapter's 4D additive masks (docs/algorithms.md §4). A config that cannot be read here is
    left to `from_pretrained` to report."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except (OSError, ValueError, KeyError):
        return "sdpa"
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# ---------------------------------------------------------------------------- the pair
def is_draft_model(draft: str) -> bool:
    """Whether the drafter named `draft` is a draft model (not the n-gram drafter or a head)."""
    return draft != NGRAM_DRAFT and not is_head_dir(draft)


def default_draft(target: str) -> str:
    """For the embedded target its shipped draft head (else its distilled draft), for
    `gemma3-270m` its shipped head, for `qwen2.5-coder-1.5b` the built-in 0.5B model of its family
    when its packages are installed; else the model-free n-gram drafter."""
    if target == EMBEDDED_TARGET and (SHIPPED_HEAD_DIR / "head.json").is_file():
        return EMBEDDED_HEAD
    if target == EMBEDDED_TARGET and (SHIPPED_DRAFT_DIR / "config.json").is_file():
        return EMBEDDED_DRAFT
    if target == GEMMA3_TARGET and (SHIPPED_GEMMA3_HEAD_DIR / "head.json").is_file():
        return GEMMA3_HEAD
    if target in BUILTIN_DRAFTS and parted_installed(BUILTIN_DRAFTS[target]):
        return BUILTIN_DRAFTS[target]
    return NGRAM_DRAFT


def model_precision(model) -> str:
    """The precision a loaded model runs in: int8 (engine/int8.py), else its weights' dtype."""
    if any(isinstance(m, (Int8Linear, Int8GroupMember)) for m in model.modules()):
        return INT8
    return str(next(model.parameters()).dtype).removeprefix("torch.")


@dataclass
class ModelPair:
    """A loaded target (wrapped in its adapter), a drafter and the target's tokenizer."""

    target_name: str
    draft_name: str
    target: ModelAdapter
    drafter: Drafter
    tokenizer: Any

    @functools.cached_property
    def precision(self) -> str:
        """The target's precision as loaded: float32, float16, bfloat16 or int8."""
        return model_precision(self.target.model)

    @functools.cached_property
    def draft_precision(self) -> str | None:
        """What the drafter computes in: a draft model's precision, a draft head's (int8 when its
        logits are), None for a drafter without weights (n-gram)."""
        return drafter_precision(self.drafter)


def planned_draft_precision(draft: str, precision: str, int8_draft: bool) -> str | None:
    """The precision the drafter named `draft` will run in beside a target of `precision`, as
    `drafter_precision` reports it once loaded (said before anything loads)."""
    if draft == NGRAM_DRAFT:
        return None
    if int8_draft:
        return INT8
    return str(parse_dtype(draft_precision(precision))).removeprefix("torch.")


def drafter_precision(drafter: Drafter) -> str | None:
    """The precision `ModelPair.draft_precision` reports for `drafter`."""
    if isinstance(drafter, ModelDrafter):
        return model_precision(drafter.lm.model)
    if isinstance(drafter, HeadDrafter):
        head = drafter.head
        return INT8 if head.int8_logits else str(drafter.dtype).removeprefix("torch.")
    return None


def check_same_vocabulary(target_model, target_tok, draft_model, draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's (speculation
    would be meaningless)."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (draft_model, target_model)]
    check_vocab_size(*rows, what=f"draft {draft_name!r}")
    if target_tok is None:  # a loaded target given without its tokenizer: the size check only
        return
    try:
        draft_tok = load_tokenizer(draft_name)
    except ArborError:
        return  # a draft without its own tokenizer files is accepted on matching vocabulary size
    check_same_tokenizer(target_tok, draft_tok, what=f"draft {draft_name!r}")


DRAFT_LOGITS = ("auto", "float", "int8")


def head_int8(draft_logits: str, device: str | torch.device, placed: bool) -> bool:
    """Whether the draft runs in int8 (a draft head: its layer and its logits, drafters/head.py; a
    draft model: every linear, engine/int8.py): `auto` = on a CPU target that no device map places
    (`placed`). `draft_logits` is `--draft-dtype`: auto, float (the target's floating dtype) or
    int8; the draft's precision never changes the output."""
    if draft_logits not in DRAFT_LOGITS:
        raise ArborError(
            f"unknown --draft-dtype {draft_logits!r}: use one of {', '.join(DRAFT_LOGITS)}"
        )
    cpu = torch.device(device).type == "cpu" and not placed
    if draft_logits == "int8" and not cpu:
        raise ArborError(
            "--draft-dtype int8 runs on CPU only (fbgemm kernels), without a device map: "
            "use --draft-dtype float or auto"
        )
    return draft_logits == "int8" or (draft_logits == "auto" and cpu)


def check_pair(
    target: str = EMBEDDED_TARGET,
    draft: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    draft_logits: str = "auto",
) -> tuple[dict, bool]:
    """What `load_pair` refuses before loading anything (one-line ArborErrors): a bad placement, a
    precision the device cannot run, a bad `draft_logits`, a local target or draft path that does
    not exist. Returns what loading then uses: the placement keywords and whether a draft head
    runs in int8."""
    draft = draft or default_draft(target)
    placement = placement_kwargs(device_map, max_memory, offload_folder)
    check_precision(dtype, device, placement)
    int8_head = head_int8(draft_logits, device, bool(placement))
    if draft != NGRAM_DRAFT and not is_head_dir(draft):
        resolve_model_path(draft)
    if target != EMBEDDED_TARGET:  # the embedded target is converted on first use: not here
        resolve_model_path(target)
    return placement, int8_head


def load_pair(
    target: str = EMBEDDED_TARGET,
    draft: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    draft_logits: str = "auto",
    compile: bool = False,
    tokenizer=None,
) -> ModelPair:
    """Load the target and the drafter.

    `target` may also be a loaded model (then `draft` may be a loaded draft model or `DraftHead`
    too, `tokenizer` is the target's, and device, dtype and placement are the model's own:
    `pair_from_models`).

    `draft`: a draft-head directory or "embedded-head" (EAGLE-style head on the target's features),
    a draft model id/dir or "embedded-draft", or "ngram".
    `device_map`, `max_memory`, `offload_folder`: place the target with accelerate (larger than
    memory: offloaded to the CPU or disk; see `placement_kwargs`); a draft model goes to the
    target's execution device.
    `draft_logits`: the precision a draft head computes in, its layer and its logits: "auto" (int8
    on CPU), "float" or "int8" (draft-side precision: never changes the output).
    `compile`: run the target's decoder through `torch.compile` (`ModelAdapter.compile`).
    """
    if not isinstance(target, str):
        pair = pair_from_models(target, tokenizer, draft, draft_logits=draft_logits)
        if compile:
            pair.target.compile()
        return pair
    draft = draft or default_draft(target)
    _, int8_head = check_pair(
        target, draft, device, dtype, device_map, max_memory, offload_folder, draft_logits
    )
    tokenizer = load_tokenizer(target)
    target_model = load_model(target, device, dtype, device_map, max_memory, offload_folder)
    adapter = ModelAdapter(target_model)
    if compile:
        adapter.compile()
    drafter = named_drafter(draft, adapter, tokenizer, dtype, int8_head)
    return ModelPair(target, draft, adapter, drafter, tokenizer)


# A draft model that runs int8 on a CPU drafts from a cut vocabulary (drafters/draft_vocab.py) when
# its own has at least CUT_VOCAB_FROM tokens: then its LM head is a large share of its forward
# (Qwen2.5's 151,936 x 896 head, a quarter of the 0.5B model). DRAFT_VOCAB: the cut's size.
CUT_VOCAB_FROM = 100_000
DRAFT_VOCAB = 32_768


def named_drafter(
    draft: str, adapter: ModelAdapter, tokenizer, precision: str, int8_head: bool
) -> Drafter:
    """The drafter a name stands for next to the target in `adapter`: "ngram", a draft-head
    directory or a shipped head's name, else a draft model's id or directory (loaded in the
    precision that goes with the target's, its vocabulary checked)."""
    if draft == NGRAM_DRAFT:
        return NgramDrafter(adapter.vocab_size)
    if is_head_dir(draft):
        head = load_head(
            resolve_head_dir(draft),
            adapter.model,
            parse_dtype(precision),
            int8_logits=int8_head,
            int8_layers=int8_head,
        )
        return HeadDrafter(head)
    draft_model = load_draft_model(draft, adapter, tokenizer, precision, int8_head)
    vocab = None
    if int8_head and draft_model.config.get_text_config().vocab_size >= CUT_VOCAB_FROM:
        vocab = frequent_tokens(tokenizer, DRAFT_VOCAB, cache_root() / "draft-vocab")
    return ModelDrafter(draft_model, int8_logits=int8_head, vocab_ids=vocab)


def load_draft_model(
    draft: str, adapter: ModelAdapter, tokenizer, precision: str, int8: bool
):
    """A draft model on the target's device, its vocabulary checked: in int8 (engine/int8.py, any
    CPU target: a draft's precision never changes the output) when `int8`, unless its attention
    needs what the int8 path lacks (logit soft-capping: then in float32); else in the target's
    floating dtype."""
    precision_of_draft = draft_precision(precision)
    if int8:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve_model_path(draft))
        if not getattr(config.get_text_config(decoder=True), "attn_logit_softcapping", None):
            precision_of_draft = INT8
    draft_model = load_model(draft, adapter.device, precision_of_draft)
    check_same_vocabulary(adapter.model, tokenizer, draft_model, draft)
    return draft_model


# ------------------------------------------------------------------ loaded objects
HEAD_BESIDE_MODEL = "arborspec-head"  # a head directory looked for inside a model's own directory


def model_name(model) -> str:
    """What a loaded model is called: the id or directory it was loaded from, else its class."""
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


def builtin_target_of(model) -> str | None:
    """The built-in target (`embedded`, `gemma3-270m`) whose converted directory `model` was
    loaded from, if any."""
    path = Path(str(getattr(model, "name_or_path", "") or "")).expanduser()
    if not path.is_dir():
        return None
    for name, folder in BUILTIN_DIRS.items():
        converted = cache_root() / folder
        if converted.is_dir() and path.resolve() == converted.resolve():
            return name
    return None



def default_draft_for(model) -> str:
    """The draft for a loaded target when none is named: the shipped head for a built-in target,
    a head directory `arborspec-head` inside the model's own directory, else the n-gram drafter."""
    builtin = builtin_target_of(model)
    if builtin is not None:
        return default_draft(builtin)
    beside = Path(str(getattr(model, "name_or_path", "") or "")).expanduser() / HEAD_BESIDE_MODEL
    if (beside / "head.json").is_file():
        return str(beside)
    return NGRAM_DRAFT


def _is_model(obj) -> bool:
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "get_output_embeddings")


def pair_from_models(
    model,
    tokenizer=None,
    draft=None,
    draft_tokenizer=None,
    draft_logits: str = "auto",
) -> ModelPair:
    """A pair around a target the caller already loaded (any precision or placement; it is used as
    it is and never changed: no layer swapped, no precision or attention changed, no hook left
    after a generation).

    `draft`: None (`default_draft_for`), "ngram", a draft-head directory or "embedded-head", a
    draft model's id or directory, a loaded draft model, or a loaded `DraftHead`. The checks are
    those of `load_pair`: the draft's vocabulary (and tokenizer, where both are known) must be the
    target's, a head must have been trained for this target. `tokenizer`: the target's (needed for
    text prompts and the tokenizer check; token ids work without one)."""
    if not _is_model(model):
        raise ArborError(
            f"expected a loaded Hugging Face causal LM as the target, got {type(model).__name__}: "
            "pass the model object (or a model name to SpeculativeGenerator(target=...))"
        )
    adapter = ModelAdapter(model)
    precision = model_precision(model)
    placed = bool(getattr(model, "hf_device_map", None))
    int8_head = head_int8(draft_logits, adapter.device, placed)
    if draft is None:
        draft = default_draft_for(model)
    if isinstance(draft, str):
        drafter: Drafter = named_drafter(draft, adapter, tokenizer, precision, int8_head)
        draft_name = draft
    elif isinstance(draft, DraftHead):
        check_vocab_size(draft.vocab_size, adapter.vocab_size, what="the draft head")
        drafter, draft_name = HeadDrafter(draft), "draft head"
    elif _is_model(draft):
        rows = draft.get_output_embeddings().weight.shape[0]
        check_vocab_size(rows, adapter.vocab_size, what=f"draft {model_name(draft)!r}")
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer, what=f"draft {model_name(draft)!r}")
        drafter, draft_name = ModelDrafter(draft), model_name(draft)
    else:
        raise ArborError(
            f"unknown draft {type(draft).__name__}: give 'ngram', a draft-head directory, a draft "
            "model (loaded, or its id or directory) or a DraftHead"
        )
    return ModelPair(model_name(model), draft_name, adapter, drafter, tokenizer)
