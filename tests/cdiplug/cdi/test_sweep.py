"""cdiplug.cdi.sweep: the one CDI-folder sweep removes exactly the regular files named stale.

Against this machine's file system in tmp_path: symlinks (to a file outside the folder),
folders and other names are left alone; a missing folder has nothing stale; an unlistable one is
a CdiError naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdiplug.cdi.sweep import sweep
from cdiplug.errors import CdiError


def test_only_regular_files_named_stale_go(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "old-a.json").write_text("{}")
    (cdi / "old-b.json").write_text("{}")
    (cdi / "keep.json").write_text("{}")
    (cdi / "old-link.json").symlink_to(outside)
    (cdi / "old-folder.json").mkdir()

    removed = sweep(cdi, lambda name: name.startswith("old-"))

    assert removed == [cdi / "old-a.json", cdi / "old-b.json"]
    assert sorted(os.listdir(cdi)) == ["keep.json", "old-folder.json", "old-link.json"]
    assert outside.read_text() == "{}"


def test_a_missing_folder_has_nothing_stale(tmp_path: Path) -> None:
    assert sweep(tmp_path / "missing", lambda name: True) == []


def test_a_folder_that_cannot_be_listed_is_an_error_naming_it(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(CdiError, match="cannot list CDI folder .*file"):
        sweep(not_a_folder, lambda name: True)
