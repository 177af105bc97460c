"""Folders a pickle is loaded from: this user's all the way down, and nobody else can write to them.

A job's result comes back as a pickle (submitit's result files, FreshProcess's outcome), and loading a
pickle runs code. So the folder it is read from must be one nobody else could have written into, or
swapped: the folder itself belongs to this user and is private (0700), and every folder above it, up
to the root or this user's home, belongs to this user or root and is not writable by group or others
(a sticky folder such as /tmp is fine: others cannot move or replace what is ours there). Both the
path as given and the path its links resolve to are checked.

Files written whole (the jobs registry, progress files, held tasks, a fresh process's outcome, the log's
side files) go through one writer, `write_atomic`: a new temporary file beside the target, never through
a link, renamed over it.

submitit names per-job folders with patterns (`logs/%j`: `%j` the job id, `%A_%a` an array): those
folders are made by submitit, so the check is on the static prefix (`logs`), the folder that holds them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

FIX = "give it a folder of your own (e.g. under your home, mode 0700)"
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_atomic(target: str | os.PathLike, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """`data` into `target` whole or not at all: a new temporary file beside it (a random name, O_EXCL:
    never an existing file, never through a symbolic link, so writers of one target never collide),
    fsynced when `durable`, then renamed over `target` (a link there is replaced, not followed). `mode`
    is the new file's (less the umask). OSError on failure, with the temporary file removed."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _NEW, mode)
    try:
        with open(fd, "wb", closefd=True) as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def static_prefix(path: str | os.PathLike) -> Path:
    """The part of `path` before its first component with a submitit pattern (`%j`, `%A`, ...)."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if "%" in part:
            return Path(*parts[:i]) if i else Path(".")
    return Path(path)


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _check_parent(folder: Path, uid: int) -> None:
    """ValueError when `folder` (a folder above the job folder) is another user's, or writable by others
    without the sticky bit."""
    st = os.lstat(folder)
    if st.st_uid not in (0, uid):
        raise ValueError(f"{folder} belongs to user {st.st_uid}: a job's results under it could be replaced by "
                         f"them before they are loaded; {FIX}")
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ValueError(f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): they could move a "
                         f"job's folder away and put theirs in its place; {FIX}")


def check_parents(path: Path) -> None:
    """Every existing folder above `path` (as given and as resolved), up to the root or this user's home,
    passes `_check_parent`; ValueError naming the first that does not. Nothing to check without POSIX users."""
    uid = _uid()
    if uid is None:
        return
    home = Path(os.path.expanduser("~")).resolve()
    chains = {Path(os.path.abspath(path)), Path(os.path.realpath(path))}
    for chain in chains:
        for folder in chain.parents:
            if os.path.lexists(folder):
                _check_parent(folder, uid)
            if folder == home or folder.resolve() == home:
                break


def owned_private_folder(path: str | os.PathLike) -> Path:
    """`path` (its static prefix for a submitit pattern) created if missing, this user's, made private
    (0700), with every folder above it checked (`check_parents`); ValueError naming the folder and the fix.

    What a pickle is loaded from: an executor's folder (cluster.check_executor), FreshProcess's folder."""
    folder = static_prefix(path)
    check_parents(folder)  # before creating anything under a parent others control
    folder.mkdir(parents=True, exist_ok=True)
    check_parents(folder)  # the folders mkdir made, and what a link in the path resolves to
    uid = _uid()
    st = folder.stat()
    if uid is not None and st.st_uid != uid:
        raise ValueError(f"the job folder {folder} belongs to user {st.st_uid}: a job would load files it did not "
                         f"write; {FIX}")
    if st.st_mode & 0o077:
        folder.chmod(0o700)
    return folder
