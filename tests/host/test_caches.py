"""Host caches within ``[gpu] cache_size``: least recently used first, never an entry in use (real flocks)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time

import pytest

from airflow_gpu_provider.host import caches

log = logging.getLogger("test.caches")


def entries(folder, *keys):
    for key in keys:
        (folder / key).mkdir(parents=True)
        with caches.using(folder, key):
            pass
        time.sleep(0.01)  # distinct last uses, oldest first


def remover(folder):
    def remove(key: str) -> bool:
        shutil.rmtree(folder / key)
        return True

    return remove


def test_the_least_recently_used_go_first_and_one_in_use_stays(tmp_path, caplog):
    entries(tmp_path, "a", "b", "c", "d")
    with caches.using(tmp_path, "a"):  # used again, and now in use: the most recent, and busy
        sizes = {"a": 10, "b": 10, "c": 10, "d": 10}
        with caplog.at_level(logging.INFO):
            assert caches.evict(tmp_path, sizes, 25, remover(tmp_path), what="entry", log=log) == ["b", "c"]
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["a", "d"]
        assert "Removed entry b (10 B, unused for" in caplog.text and "[gpu] cache_size=25 B" in caplog.text
        assert caches.evict(tmp_path, {"a": 10, "d": 10}, 1, remover(tmp_path), what="entry", log=log) == ["d"]
    assert (tmp_path / "a").is_dir()  # in use while the cache was over its size
    assert caches.evict(tmp_path, {"a": 10}, 0, remover(tmp_path), what="entry", log=log) == []  # 0: no limit


def test_a_task_that_waited_on_a_removed_entry_looks_again(tmp_path):
    entries(tmp_path, "a")
    got = []
    removing = threading.Event()

    def slow_remove(key: str) -> bool:
        removing.set()
        time.sleep(0.3)  # a task asks for the entry meanwhile, and waits for the lock
        shutil.rmtree(tmp_path / key)
        return True

    def task() -> None:
        removing.wait(5)
        with caches.using(tmp_path, "a") as fd:
            got.append((os.fstat(fd).st_ino, (tmp_path / "a").exists()))

    user = threading.Thread(target=task)
    user.start()
    assert caches.evict(tmp_path, {"a": 2}, 1, slow_remove, what="entry", log=log) == ["a"]
    user.join(5)
    inode, exists = got[0]
    assert inode == caches.use_file(tmp_path, "a").stat().st_ino  # a new use file, not the removed one
    assert not exists  # so it builds the entry again, under its own lock


def test_a_failed_build_held_twice_leaves_no_use_file(tmp_path):
    """The local backend holds its venv's use file around the build that holds it too: the outermost removes it."""
    exists = (tmp_path / "a").is_dir
    with (
        pytest.raises(RuntimeError),
        caches.using(tmp_path, "a", exists=exists),
        caches.using(tmp_path, "a", exists=exists),
    ):
        raise RuntimeError("the build failed")
    assert not caches.use_file(tmp_path, "a").exists()
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError), caches.using(tmp_path, "b", exists=(tmp_path / "b").is_dir):
        raise RuntimeError("the task failed, its entry built")
    assert caches.use_file(tmp_path, "b").exists()  # an entry that is there keeps its last use
