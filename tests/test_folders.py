"""Folders a pickle is loaded from (launch/folders.py): this user's all the way down, nobody else can write
to them; submitit's `logs/%j` checked at its static prefix; FreshProcess's folder checked; and a Jobs
without a log leaves no temporary folder behind (issue 49 items 8 and 18)."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import pytest

from workbench.launch.cluster import check_executor
from workbench.launch.fresh import FreshProcess

OTHER_UID = 54321  # a user that is not this one (the tests chown to it where they may)


class Executor:
    """The executor seam's shape: submit, and the folder submitit keeps its job files in."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = folder

    def submit(self, fn, *args, **kwargs):  # never called here
        raise AssertionError


def test_submitit_s_job_pattern_is_checked_at_its_static_prefix(tmp_path):
    check_executor(Executor(tmp_path / "mine" / "logs" / "%j"))
    logs = tmp_path / "mine" / "logs"
    assert logs.is_dir() and stat.S_IMODE(logs.stat().st_mode) == 0o700  # the real job folders' parent
    assert not (logs / "%j").exists()  # no literal %j folder
    check_executor(Executor(str(tmp_path / "arr" / "%A_%a")))
    assert stat.S_IMODE((tmp_path / "arr").stat().st_mode) == 0o700


@pytest.mark.parametrize("where", ["executor", "fresh"])
def test_a_folder_under_a_parent_others_can_write_is_refused(tmp_path, where):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may rename our job folder away and put theirs in its place
    with pytest.raises(ValueError, match=r"shared.*writable by others.*folder of your own"):
        if where == "executor":
            check_executor(Executor(shared / "logs" / "%j"))
        else:
            FreshProcess(folder=shared / "jobs").submit(print, "never runs")
    assert not (shared / "jobs").exists() and not list(shared.iterdir())


def test_a_sticky_world_writable_parent_is_fine_and_the_folder_itself_is_made_private(tmp_path):
    from workbench.launch.folders import owned_private_folder

    sticky = tmp_path / "tmpish"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others cannot move what is ours
    mine = sticky / "mine"
    mine.mkdir(mode=0o777)
    mine.chmod(0o777)
    assert owned_private_folder(mine) == mine and stat.S_IMODE(mine.stat().st_mode) == 0o700


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_folder_or_a_parent_of_another_user_is_refused(tmp_path):
    from workbench.launch.folders import owned_private_folder

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match=rf"theirs belongs to user {OTHER_UID}"):
        check_executor(Executor(theirs / "logs" / "%j"))
    with pytest.raises(ValueError, match=rf"theirs belongs to user {OTHER_UID}"):
        owned_private_folder(theirs)
    link = tmp_path / "link"
    link.symlink_to(theirs)  # a link of ours to a folder of theirs: its target is what is checked
    with pytest.raises(ValueError, match=rf"belongs to user {OTHER_UID}"):
        FreshProcess(folder=link).submit(print, "never runs")


def test_a_jobs_without_a_log_removes_its_temporary_folder():
    from workbench.launch.jobs import Jobs

    jobs = Jobs(Executor("unused"), None, device="cpu")
    folder = jobs.dir
    assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    (folder / "progress-x.json").write_text("{}")
    del jobs
    gc.collect()
    assert not folder.exists()


# ---- one mechanism each: the atomic writer, the private folder --------------------------------------
def test_one_atomic_writer_renames_files_into_place():
    """Every file the package writes whole (progress, the jobs registry, held tasks, fresh outcomes, the
    log's side files and save) goes through folders.write_atomic: nothing else renames a file into place."""
    import ast

    package = Path(__file__).resolve().parents[1] / "workbench"

    def renames_a_file(node):  # os.replace(a, b), or path.replace(other): not str.replace(a, b), not replace(x, k=v)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"):
            return False
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
            return True
        return len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Constant)

    renames = [f"{path.relative_to(package)}:{node.lineno}" for path in sorted(package.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if renames_a_file(node)]
    assert [r.split(":")[0] for r in renames] == ["launch/folders.py"], renames


def test_two_writers_of_one_progress_file_never_lose_a_write(tmp_path):
    import threading

    from workbench.launch.watcher import write_progress

    target = tmp_path / "progress.json"
    failed = []

    def write(n):
        for i in range(300):
            if not write_progress(target, "measuring", i, n):
                failed.append(i)

    threads = [threading.Thread(target=write, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed and [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # whole, no temporary left


def test_write_atomic_never_writes_through_a_link(tmp_path):
    from workbench.launch.folders import write_atomic

    victim = tmp_path / "victim"
    victim.write_text("theirs")
    (tmp_path / "entry.json").symlink_to(victim)
    write_atomic(tmp_path / "entry.json", b"ours")
    assert victim.read_text() == "theirs" and (tmp_path / "entry.json").read_text() == "ours"
    assert not (tmp_path / "entry.json").is_symlink() and stat.S_IMODE((tmp_path / "entry.json").stat().st_mode) == 0o600


def test_the_jobs_progress_files_live_in_a_folder_checked_as_every_job_folder(tmp_path):
    """One private-folder rule: the jobs folder a progress file is made in is checked all the way up."""
    from workbench.launch import cluster

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="writable by others"):
        cluster.new_progress_file(shared / "runs.jobs")
    assert not hasattr(cluster, "private_folder")
