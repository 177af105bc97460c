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
