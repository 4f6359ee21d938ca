"""policy/paths.py: paths resolved from / without following a link, every folder on the way checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_gpu_provider.policy.paths import (
    UnsafePathError,
    make_private,
    remove_marked,
    stable,
    write_marker,
)

OTHER_USER = 1000  # another local user of the worker host (the tests run as root, which may chown)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


def test_a_plain_folder_of_the_worker_is_stable(base):
    (base / "a" / "b").mkdir(parents=True)
    assert stable(str(base / "a" / "b"), directory=True).st_uid == os.geteuid()


@pytest.mark.parametrize("link_to", ["/", "/etc", "."])
def test_a_link_anywhere_on_the_way_is_refused(base, link_to):
    (base / "link").symlink_to(link_to)
    for path in (base / "link", base / "link" / "etc"):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            stable(str(path))


@pytest.mark.parametrize("path", ["relative/path", "/a/../etc", "/a/./b", ""])
def test_only_absolute_plain_names_are_taken(path):
    with pytest.raises(UnsafePathError, match=r"absolute path|'\.' or '\.\.'"):
        stable(path)


def test_a_folder_of_another_user_on_the_way_is_refused(base):
    (base / "theirs" / "mine").mkdir(parents=True)
    os.chown(base / "theirs", OTHER_USER, OTHER_USER)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {OTHER_USER}"):
        stable(str(base / "theirs" / "mine"))


def test_a_folder_others_may_write_to_is_refused_unless_sticky(base):
    (base / "shared" / "x").mkdir(parents=True)
    (base / "shared").chmod(0o777)
    with pytest.raises(UnsafePathError, match="others may write to it"):
        stable(str(base / "shared" / "x"))
    (base / "shared").chmod(0o1777)  # sticky, as /tmp: only an entry's owner may rename it
    stable(str(base / "shared" / "x"))
    os.chown(base / "shared" / "x", OTHER_USER, OTHER_USER)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {OTHER_USER} in a folder others may write to"):
        stable(str(base / "shared" / "x"))


def test_folders_are_made_private_beneath_a_stable_one_only(base):
    made = make_private(str(base / "c" / "d"))
    assert Path(made).is_dir() and Path(made).stat().st_mode & 0o777 == 0o700
    (base / "other").mkdir()
    os.chown(base / "other", OTHER_USER, OTHER_USER)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {OTHER_USER}"):
        make_private(str(base / "other" / "mine"))
    assert not (base / "other" / "mine").exists()


def test_only_a_marked_folder_is_deleted_and_never_through_a_link(base):
    write_marker(str(base / "root" / "dag" / "run"), {"dag_id": "dag", "run_id": "run"})
    (base / "root" / "dag" / "run" / "data").write_text("x")
    (base / "root" / "unmarked").mkdir()
    (base / "elsewhere").mkdir()
    (base / "elsewhere" / "precious").write_text("keep")
    (base / "root" / "dag" / "linked").symlink_to(base / "elsewhere")
    with pytest.raises(UnsafePathError, match="no marker"):
        remove_marked(str(base / "root"), "unmarked", {})
    with pytest.raises(UnsafePathError, match="no marker"):
        remove_marked(str(base / "root"), "dag/run", {"dag_id": "dag", "run_id": "another"})
    with pytest.raises(UnsafePathError, match="not a folder"):
        remove_marked(str(base / "root"), "dag/linked", {})
    assert (base / "elsewhere" / "precious").read_text() == "keep"
    assert remove_marked(str(base / "root"), "dag/run", {"dag_id": "dag", "run_id": "run"})
    assert not (base / "root" / "dag" / "run").exists()
    assert remove_marked(str(base / "root"), "dag/gone", {}) is False
