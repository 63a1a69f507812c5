"""Resumable data folders of the offline tools: one safetensors shard per batch, written whole.

`distill.py` (the target's answers and top-k soft labels) and `head_data.py` (the target's
answers and features) make their training data batch by batch. Batch `b` becomes
`shard_{b:05d}.safetensors`, written atomically (`common/atomic.py`), so Ctrl-C loses at most the
batch in flight; a rerun finds the shards on disk and generates only the missing batches.
`meta.json` records the settings the data was made with; a rerun with other settings is refused
instead of mixing two kinds of data in one folder.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

from ..common.atomic import save_tensors_atomic
from ..common.jsonfiles import write_json_atomic
from ..common.progress import progress_bar
from ..common.timing import clock
from ..errors import ArborError

SHARD_PREFIX = "shard_"
META_FILE = "meta.json"


def shard_paths(data_dir: str | Path) -> list[Path]:
    """The folder's shards, in batch order."""
    return sorted(Path(data_dir).glob(f"{SHARD_PREFIX}*.safetensors"))


def claim_data_dir(data_dir: Path, settings: dict, record: dict, hint: str) -> None:
    """Make `data_dir` (if needed) and write its `meta.json` ({"settings": settings, **record});
    refuse a folder whose data was made with other `settings` (`hint` says what to do instead)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    meta_path = data_dir / META_FILE
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("settings") != settings:
        raise ArborError(f"{data_dir} holds data made with other settings: {hint}")
    write_json_atomic({"settings": settings, **record}, meta_path, indent=2)


class ShardLoop:
    """The batches still to generate into `data_dir`, with a progress bar and a time budget.

    Iterating yields the index of every batch without a shard on disk, in order, and stops early
    once `time_budget_s` (> 0) has passed; `save` writes a batch's shard and moves the bar on.
    """

    def __init__(
        self,
        data_dir: Path,
        batches: int,
        *,
        label: str,
        time_budget_s: float = 0.0,
        progress: bool = True,
    ) -> None:
        self.data_dir, self.batches, self.label = Path(data_dir), batches, label
        self.time_budget_s, self.progress = time_budget_s, progress
        self.new_tokens = 0
        self._bar = self._task = None
        self._start = clock()

    def done(self) -> set[int]:
        """The batches with a shard on disk."""
        return {int(p.stem[len(SHARD_PREFIX) :]) for p in shard_paths(self.data_dir)}

    def __iter__(self) -> Iterator[int]:
        done = self.done()
        with progress_bar(self.progress) as bar:
            self._bar = bar
            self._task = bar.add_task(self.label, total=self.batches, completed=len(done), info="")
            for b in range(self.batches):
                if b in done:
                    continue
                if self.time_budget_s and clock() - self._start > self.time_budget_s:
                    print(
                        f"arborspec: data time budget reached with {len(self.done())} of "
                        f"{self.batches} batches in {self.data_dir}; rerun to continue",
                        file=sys.stderr,
                    )
                    break
                yield b
            self._bar = None

    def save(self, batch: int, tensors: dict, metadata: dict[str, str], new_tokens: int) -> None:
        """Write batch `batch`'s shard; `new_tokens` (the tokens it generated) feeds the rate."""
        path = self.data_dir / f"{SHARD_PREFIX}{batch:05d}.safetensors"
        save_tensors_atomic(tensors, path, metadata)
        self.new_tokens += new_tokens
        if self._bar is not None:
            rate = self.new_tokens / max(clock() - self._start, 1e-9)
            info = f"{self.new_tokens} new tokens, {rate:.1f} tok/s"
            self._bar.update(self._task, advance=1, info=info)
