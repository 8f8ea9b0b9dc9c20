"""PagePusher without FUSE: a recording store in place of ``pyfuse3.notify_store``."""

from __future__ import annotations

import errno

import pyfuse3
import pytest

from refmount.base.stats import Stats
from refmount.fuse.pagepush import PagePusher


class Store:
    """Records each store; raises ``fail`` (an OSError) instead when set."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bytes]] = []
        self.fail: OSError | None = None

    def __call__(self, inode: int, offset: int, data: bytes | memoryview) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append((inode, offset, bytes(data)))


def test_push_stores_the_whole_file_once_per_inode() -> None:
    store, stats = Store(), Stats()
    p = PagePusher(store, stats)
    assert p.wanted(5) and p.wanted(6)
    p.push(5, memoryview(b"abcdef")[1:4])
    assert store.calls == [(5, 0, b"bcd")]  # the whole file: from offset 0
    assert stats.pushed == 3
    assert not p.wanted(5)  # the kernel has the bytes
    assert p.wanted(6)


def test_an_inode_read_through_a_read_is_not_wanted() -> None:
    p = PagePusher(Store(), Stats())
    p.given(7)  # a READ answered it
    assert not p.wanted(7) and p.wanted(8)


def test_remembered_inodes_are_bounded_least_recent_first(monkeypatch) -> None:
    monkeypatch.setattr(PagePusher, "REMEMBERED", 3)
    p = PagePusher(Store(), Stats())
    for ino in (1, 2, 3, 4):
        p.given(ino)
    assert p.wanted(1)  # forgotten: the least recently given
    assert not any(p.wanted(i) for i in (2, 3, 4))
    p.given(2)  # given again: now the most recent
    p.given(5)
    assert p.wanted(3) and not any(p.wanted(i) for i in (2, 4, 5))


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_kernel_without_stores_turns_pushing_off(code: int) -> None:
    store, stats = Store(), Stats()
    p = PagePusher(store, stats)
    store.fail = OSError(code, "no")
    p.push(1, b"x" * 10)
    assert not p.enabled and stats.pushed == 0
    assert not p.wanted(2)  # no inode is wanted any more
    store.fail = None
    p.push(2, b"y")
    assert store.calls == []  # nor pushed


def test_other_store_errors_leave_pushing_on_and_the_read_to_come() -> None:
    store, stats = Store(), Stats()
    p = PagePusher(store, stats)
    store.fail = OSError(errno.ENOENT, "the kernel forgot the inode")
    p.push(1, b"x" * 10)
    assert p.enabled and stats.pushed == 0
    assert not p.wanted(1)  # not tried again on the next open: its READ serves it
    store.fail = None
    p.push(2, b"yz")
    assert store.calls == [(2, 0, b"yz")] and stats.pushed == 2


def test_pyfuse3_store_without_a_session_is_an_ordinary_error() -> None:
    """pyfuse3.notify_store outside a mount raises OSError(EINVAL): nothing else happens."""
    p = PagePusher(pyfuse3.notify_store, Stats())
    p.push(1, b"abc")
    assert p.enabled and p.stats.pushed == 0
