"""The results file every benchmark writes (`results.jsonl` in its output folder): JSON Lines, a
header record first, then one record per finished run, each flushed and fsynced as soon as it
exists; opened for `--resume` (its header and finished records, a half-written last line dropped)
only with the settings that made it; Ctrl-C keeps every finished record and still writes the
report."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from ..common.progress import progress_bar
from ..common.provenance import machine_info, versions
from ..errors import ArborError, Interrupted
from .report import read_results

RESULTS_NAME = "results.jsonl"


class ResultsFile:
    """Append-only JSONL writer: every record is flushed (and fsynced) as soon as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def open_results(out_dir, resume: bool) -> tuple[Path, dict | None, list[dict]]:
    """The results file in `out_dir` (created, checked writable); with `resume`, its header and
    finished records (a half-written last line dropped), else an error if it holds results."""
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ArborError(
            f"cannot write to output dir {str(out)!r} ({exc.strerror or exc}): choose another --out"
        ) from None
    path = out / RESULTS_NAME
    if not path.exists() or path.stat().st_size == 0:
        return path, None, []
    if not resume:
        raise ArborError(
            f"{path} already holds results: pass --resume to continue that run, or "
            "choose another --out"
        )
    header, records, _ = read_results(path, allow_partial_tail=True, allow_empty=True)
    _repair_tail(path)
    return path, header, records


def _repair_tail(path: Path) -> None:
    """Drop a half-written last line (the process was killed mid-write) so appends
    start on a fresh line."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


@dataclass(frozen=True)
class RecordKey:
    """What a record is the run of (a benchmark's key subclasses it with its fields): the key of
    `done` in a resumed sweep."""

    @classmethod
    def of(cls, record: dict):
        """The key of a record: its fields by name, a float field as a float (a results file
        may hold 0 for 0.0)."""
        return cls(
            *(
                float(record[f.name]) if f.type in ("float", float) else record[f.name]
                for f in fields(cls)
            )
        )


def pair_fields(pair) -> dict:
    """The header fields of a benchmark of a loaded `models.ModelPair`: package versions, the
    target's device, the machine, the target and the draft."""
    return {
        "versions": versions(),
        "device": str(pair.target.device),
        "machine": machine_info(),
        "target": pair.target_name,
        "draft": pair.draft_name,
    }


def check_resume_compatible(old: dict, new: dict, path: Path, keys: tuple[str, ...]) -> None:
    """Refuse to append to a results file whose header's config differs from `new`'s in `keys`."""
    for key in keys:
        if old["config"].get(key) != new["config"].get(key):
            raise ArborError(
                f"{path} was made with {key}={old['config'].get(key)!r}, not "
                f"{new['config'].get(key)!r}: resume with the same settings or "
                "choose another --out"
            )


def record_runs(
    path: Path,
    out_dir: Path,
    runs: Callable[[ResultsFile], None],
    write_report: Callable[[Path, Path], Path],
    quiet: bool,
) -> Path:
    """Append what `runs(results)` writes to the results file at `path`, then write the report
    (`write_report(path, out_dir)`); returns `path`. Ctrl-C stops the runs, keeps every finished
    record, still writes the report, then raises `Interrupted` saying how to continue."""
    results = ResultsFile(path)
    interrupted = False
    try:
        runs(results)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        results.close()
    _finish(path, out_dir, write_report, quiet)
    if interrupted:
        raise Interrupted(
            f"interrupted; finished runs kept in {path}; rerun with --resume to continue"
        )
    return path


def record_missing(
    results: ResultsFile,
    done: dict,
    runs: Iterable[tuple[Hashable, str, Callable[[], dict]]],
    total: int,
    title: str,
    quiet: bool,
) -> None:
    """The sweep: for every (key, description, run) of `runs`, in order, `run()` where `done` has
    no record for `key` yet, its record written to `results` and added to `done` (so a resumed
    sweep runs only what is missing); a progress bar titled `title` over `total` runs, each
    described as it starts, with the last run's tokens/s."""
    with progress_bar(not quiet) as progress:
        task = progress.add_task(title, total=total, info="")
        for key, description, run in runs:
            progress.update(task, description=description)
            if key not in done:
                record = run()
                results.write(record)
                done[key] = record
                wall = record["wall_time"]
                rate = record["new_tokens"] / wall if wall > 0 else 0.0
                progress.update(task, info=f"{rate:6.1f} tok/s")
            progress.advance(task)


def _finish(
    path: Path, out_dir: Path, write_report: Callable[[Path, Path], Path], quiet: bool
) -> None:
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    try:
        report = write_report(path, out_dir)
    except ArborError as exc:
        console.print(f"no report written: {exc}")
        return
    console.print(f"results: {path}\nreport:  {report}")
