"""A run's checkpoint folders on disk: their layout, how one is saved so that a killed save never becomes the one
resumed from, which one a run resumes from, and what a resume sets aside. What goes into them (the engine's state
and every rank's RNG) is the Policy's (tokenpo.trainer.core.policy); the manifest check is tokenpo.trainer.harness.checkpoint_manifest.

Layout under `<run_dir>/checkpoints/`: `step_000004/` (DeepSpeed's `state/` folder, `rng_rank<r>.pt` per rank,
`tokenpo.json` with the step, the number of processes, the ZeRO stage and the LoRA settings, `manifest.json` with the
crc32 and size of every other file, each checksummed by the rank that wrote it) and `latest` (JSON naming the newest
complete one). A checkpoint is written into a hidden temporary folder, its manifest last, and renamed into place only
after every rank finished writing, then `latest` is replaced atomically. Resuming verifies the manifest first:
`resume=auto` takes the newest checkpoint that verifies, an explicit path fails in one line. A checkpoint of an
earlier format (no manifest, sha256 records, a tokenpo.json without the ZeRO stage) is refused in one line. Every
rank writes its own shards into the same folder, so a multi-node run dir must be on a shared filesystem.

No torch here: the start-up check (tokenpo.preflight) finds the checkpoint to resume before torch is imported.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenpo.errors import ConfigError
from tokenpo.progress import folder_progress
from tokenpo.trainer.harness.checkpoint_manifest import (
    LONE,
    MANIFEST,
    CheckpointError,
    Ranks,
    manifest_records,
    recorded_bytes,
    verify_manifest,
)
from tokenpo.trainer.harness.rundir import NO_CHECKPOINT, move_aside

log = logging.getLogger("tokenpo")

TAG = "state"  # DeepSpeed's folder in a checkpoint (its save_checkpoint tag)
META = "tokenpo.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
STEP_DIR = re.compile(r"step_(\d+)")


def rng_file(folder: Path, rank: int) -> Path:
    """Rank `rank`'s RNG states in checkpoint `folder` (checkpoint_manifest.RANK_IN_NAME reads the rank back)."""
    return folder / f"rng_rank{rank}.pt"


@dataclass(frozen=True)
class CheckpointMeta:
    """tokenpo.json: what a resume must match."""

    step: int
    world_size: int  # processes that wrote it (DeepSpeed's shards are per rank)
    zero_stage: int
    lora: dict | None  # model.lora settings (LoraConfig.settings()); None, no key on disk: full fine-tuning

    def as_json(self) -> dict:
        meta = {"step": self.step, "world_size": self.world_size, "zero_stage": self.zero_stage}
        return meta | ({"lora": self.lora} if self.lora else {})


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {err})") from None


def read_meta(path: Path) -> CheckpointMeta:
    """Checkpoint `path`'s tokenpo.json; one line when it lacks a key (an earlier tokenpo's checkpoint)."""
    meta = read_json(path / META)
    try:
        return CheckpointMeta(int(meta["step"]), int(meta["world_size"]), int(meta["zero_stage"]), meta.get("lora"))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path / META}: no step, world_size and zero_stage ({type(err).__name__}: {err}; "
                              "written by an earlier tokenpo: not resumable by this one)") from None


def process_ranks() -> Ranks:
    """This process group, to save or verify a checkpoint together (each rank checksums the files it wrote)."""
    # imported here: tokenpo.deepspeed.dist imports torch, which the start-up check does without
    from tokenpo.deepspeed import dist

    return Ranks(dist.rank(), dist.world_size(), dist.all_gather_objects)


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader sees the old or the new content, never a mix)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def step_dirs(root: Path) -> list[Path]:
    """The checkpoint folders under `root`, oldest step first (by number: names sort wrongly past 999999)."""
    return sorted((p for p in root.glob("step_*") if STEP_DIR.fullmatch(p.name) and p.is_dir()), key=step_of)


def step_of(path: Path) -> int:
    return int(STEP_DIR.fullmatch(path.name).group(1))


def previous_state_bytes(root: Path) -> int | None:
    """Bytes of DeepSpeed's state in the newest checkpoint under `root` by its manifest, the size the next save of the
    same run will have (None without one: it only sizes a progress bar)."""
    newest = step_dirs(root)[-1:]
    return recorded_bytes(newest[0], f"{TAG}/") if newest else None


def save(root: Path, meta: CheckpointMeta, write_state: Callable[[Path], None], *, keep_last: int,
         with_checksums: bool) -> Path:
    """Checkpoint `meta.step` on every rank (a collective): `write_state(folder)` writes this rank's files into the
    folder (DeepSpeed's TAG folder and its RNG file); keep it and the newest `keep_last` - 1 earlier ones.
    `with_checksums` (trainer.verify_checkpoints=full): the manifest records checksums, not sizes alone."""
    ranks = process_ranks()
    final = root / f"step_{meta.step:06d}"
    tmp = root / f"{TMP_PREFIX}step_{meta.step:06d}"
    if ranks.is_main:
        root.mkdir(parents=True, exist_ok=True)
        # leftovers of saves that were killed midway
        for stale in root.glob(f"{TMP_PREFIX}step_*"):
            shutil.rmtree(stale)
    ranks.gather(None)  # every rank waits for the folder to be cleared
    # the bar is rank 0's: only it reads the previous checkpoint's manifest to size it
    with folder_progress(tmp / TAG, total=previous_state_bytes(root) if ranks.is_main else None,
                         desc=f"saving checkpoint step {meta.step}", enabled=ranks.is_main):
        write_state(tmp)
    ranks.gather(None)  # every rank has written its files
    if ranks.is_main:
        (tmp / META).write_text(json.dumps(meta.as_json()))
    records = manifest_records(tmp, ranks, with_checksums)
    if ranks.is_main:
        # last: a folder with a manifest holds every file it lists
        (tmp / MANIFEST).write_text(json.dumps(records, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        replace_text(root / LATEST, json.dumps({"step": meta.step, "path": final.name}))
        # by step, and never the one just written (later-numbered folders of another history were set aside)
        earlier = [p for p in step_dirs(root) if step_of(p) < meta.step]
        for old in earlier[:max(len(earlier) - (keep_last - 1), 0)]:
            shutil.rmtree(old)
    ranks.gather(None)  # the checkpoint is in place before any rank goes on
    return final


def check_resumable(path: Path, meta: CheckpointMeta, world_size: int, zero_stage: int, lora: dict | None) -> None:
    """One line when checkpoint `path` cannot be resumed by this run's processes, ZeRO stage or LoRA settings
    (DeepSpeed's own errors for these mismatches are far from one line: its universal checkpoint converts)."""
    if meta.world_size != world_size:
        raise ConfigError(f"checkpoint {path} was written by {meta.world_size} process(es); resume it with "
                          f"{meta.world_size}, not {world_size}")
    if meta.zero_stage != zero_stage:
        raise ConfigError(f"checkpoint {path} was written under ZeRO stage {meta.zero_stage}; resume it with "
                          f"deepspeed.stage={meta.zero_stage}, not {zero_stage}")
    check_adapters(path, lora)


def check_adapters(path: Path, lora: dict | None) -> None:
    """The checkpoint at `path` was trained with the LoRA settings `lora` (None: full fine-tuning); one line naming
    the keys that differ otherwise (a LoRA checkpoint holds no base weights)."""
    saved = read_meta(path).lora
    if saved == lora:
        return
    if saved is None or lora is None:
        what = "full fine-tuning" if saved is None else f"LoRA rank {saved['rank']}"
        raise ConfigError(f"checkpoint {path} was trained with {what}: resume it with "
                          + ("model.lora.rank=0" if saved is None else f"model.lora.rank={saved['rank']}")
                          + " (model.lora settings must match the checkpoint's)")
    diffs = ", ".join(f"model.lora.{k}={saved.get(k)!r} (not {lora.get(k)!r})" for k in sorted(set(saved) | set(lora))
                      if saved.get(k) != lora.get(k))
    raise ConfigError(f"checkpoint {path} was trained with other LoRA settings: resume it with {diffs}")


def newest_verified(root: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> Path | None:
    """The newest checkpoint under `root` whose manifest checks out; one warning line (rank 0's) for those skipped and
    a lost `latest`. The candidates are those rank 0 lists, so every rank verifies the same ones."""
    notes = []
    for name in ranks.from_main([p.name for p in reversed(step_dirs(root))] if ranks.is_main else None):
        path = root / name
        try:
            verify_manifest(path, quick, ranks, with_checksums)
        except CheckpointError as err:
            notes.append(f"skipped {err}")
            continue
        try:
            latest = latest_target(root, "auto")
            if latest != path and not notes:
                notes.append(f"{root / LATEST} names {latest.name}")
        except CheckpointError as err:
            notes.append(str(err))
        if notes and not quick and ranks.is_main:
            log.warning("trainer.resume=auto: %s; resuming from %s", "; ".join(notes), path)
        return path
    if notes:
        raise CheckpointError(f"trainer.resume=auto: no checkpoint in {root} verifies ({'; '.join(notes)}); "
                              f"trainer.resume=none starts over and moves them aside")
    return None


def verified_at(path: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> Path:
    """trainer.resume=<path>: a checkpoint folder, or the one `latest` names in a run dir or its checkpoints folder."""
    if not (path / TAG).is_dir() and not (path / MANIFEST).is_file():
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        if not (root / LATEST).is_file():
            run = (path / "metrics.jsonl").is_file() or (path / ".hydra").is_dir()
            raise ConfigError(f"trainer.resume={str(path)!r}: no checkpoint there (neither a '{TAG}' folder nor a "
                              f"'{LATEST}' file)" + (f"; the run there ran, but {NO_CHECKPOINT}" if run else ""))
        path = latest_target(root, str(path))
    verify_manifest(path, quick, ranks, with_checksums)
    return path


def latest_target(root: Path, resume: str) -> Path:
    latest = root / LATEST
    if not latest.is_file():
        raise CheckpointError(f"{latest} is missing")
    try:
        name = json.loads(latest.read_text())["path"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{latest}: unreadable ({type(err).__name__}: {err})") from None
    path = root / str(name)
    if not (path / TAG).is_dir():
        raise CheckpointError(f"trainer.resume={resume!r}: {latest} names {path.name}, which is missing or incomplete")
    return path


def resume_dir_on_disk(resume: str, run_dir: Path, quick: bool = False, ranks: Ranks = LONE,
                       with_checksums: bool = True) -> Path | None:
    """The checkpoint trainer.resume names (see `find_resume_dir`), looked up by `ranks` together (a collective when
    several; each checksums its own files); `quick`: no checksums and no log lines; not `with_checksums`
    (trainer.verify_checkpoints=sizes): no checksums."""
    if resume == "none":
        return None
    if resume == "auto":
        return newest_verified(run_dir / "checkpoints", quick, ranks, with_checksums)
    return verified_at(Path(resume), quick, ranks, with_checksums)


def find_resume_dir(resume: str, run_dir: Path, quick: bool = False, with_checksums: bool = True) -> Path | None:
    """`auto`: the newest checkpoint of this run dir that verifies, if any; `none`; or a checkpoint folder / run dir
    path, which must verify. Every rank checksums the files it wrote, all at once; every rank gets rank 0's answer (or
    its error). `quick` (a start-up check; the run looks again in full): no checksums and no log lines; not
    `with_checksums` (trainer.verify_checkpoints=sizes): presence and sizes only."""
    ranks = process_ranks()
    try:
        answer = resume_dir_on_disk(resume, run_dir, quick, ranks, with_checksums)
    except ConfigError as err:
        answer = err
    answer = ranks.from_main(answer)
    if isinstance(answer, ConfigError):
        raise answer
    return answer


def set_aside_stale(root: Path, resume_dir: Path | None) -> None:
    """Move the checkpoints under `root` that this run does not continue (all of them on a fresh start or a resume
    from elsewhere, the later ones on a resume from an earlier one there) into `checkpoints.previous-<time>/`.
    Otherwise they would outrank the new ones: pruning would delete what the run just wrote, resume=auto pick them.
    Rank 0 only."""
    if not process_ranks().is_main:
        return
    here = resume_dir is not None and resume_dir.parent.resolve() == root.resolve()
    continued = step_of(resume_dir) if here else -1
    stale = [p for p in step_dirs(root) if step_of(p) > continued]
    if not stale:
        return
    folder = move_aside(stale, root)
    # the next save rewrites it; until then it names the checkpoint continued, or none
    if here:
        replace_text(root / LATEST, json.dumps({"step": continued, "path": resume_dir.name}))
    elif (root / LATEST).is_file():
        os.replace(root / LATEST, folder / LATEST)
    log.warning("moved %d checkpoint(s) this run does not continue (%s) to %s", len(stale),
                ", ".join(p.name for p in stale), folder)


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (-1: all) from a metrics.jsonl, so a run resumed from an older checkpoint
    (or restarted) does not log those steps twice. Rank 0 only."""
    if not process_ranks().is_main or not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _record_step(line) is not None and _record_step(line) <= last_step]
    if len(kept) != len(lines):
        replace_text(path, "".join(kept))


def _record_step(line: str) -> int | None:
    """The step of a metrics line; None for a line cut short by a killed process."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
