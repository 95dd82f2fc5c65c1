"""Ring segments are not predictable and not plantable.

A call's ring names carry a random key (64 bits) the gateway draws per call; segments
are created exclusively (a name that exists, even as a symlink, is never opened) and
mode 0600 whatever the umask; an attach maps only a regular file of the effective user
with mode 0600. A segment planted by *another user* needs a second uid: the test runs
it when the suite runs as root (chown to nobody) and otherwise checks the mode check and
the O_EXCL collision, which are what stop a planted segment without root.
"""

from __future__ import annotations

import os
import re

import pytest

import brisvox.gateway.core.calls as calls_mod
from brisvox.gateway.core.calls import KINDS, AdmissionError, CallTable
from ipc.ring import (
    SHM_DIR,
    Ring,
    RingError,
    new_ring_key,
    ring_name,
    sibling_name,
    sweep_segments,
)


def test_keys_are_random_and_in_the_name() -> None:
    keys = {new_ring_key() for _ in range(2000)}
    assert len(keys) == 2000 and all(re.fullmatch(r"[0-9a-f]{16}", k) for k in keys)
    k = new_ring_key()
    assert ring_name("1-2", "c7", "in", k) == f"brisvox.1-2.c7-{k}.in"
    assert ring_name("1-2", "c7", "in") == "brisvox.1-2.c7.in"  # the keyless form of tests and benches
    for bad in ("../x", "ABCDEF0123456789", "abc", "g" * 16):
        with pytest.raises(RingError, match="key"):
            ring_name("1-2", "c7", "in", bad)
    assert sibling_name(f"brisvox.1-2.c7-{k}.in16", "ttsjob0") == f"brisvox.1-2.c7-{k}.ttsjob0"
    with pytest.raises(RingError):
        sibling_name("brisvox.1-2.c7.in16", "../x")


def test_the_call_tables_names_cannot_be_derived_from_the_call_id(shm_clean: str) -> None:
    table = CallTable(shm_clean, max_calls=4, ring_seconds=0.1)
    a = table.admit("native", "x", 8000, 16000)
    b = table.admit("native", "x", 8000, 16000)
    try:
        for call in (a, b):
            assert re.fullmatch(r"[0-9a-f]{16}", call.ring_key)
            assert {r.name for r in call.rings.values()} == {ring_name(shm_clean, call.call_id, k, call.ring_key)
                                                             for k in KINDS}
            assert not (SHM_DIR / ring_name(shm_clean, call.call_id, "in")).exists()  # no keyless twin
        assert a.ring_key != b.ring_key
    finally:
        table.release(a)
        table.release(b)


def test_a_planted_name_refuses_the_call_and_is_left_alone(shm_clean: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attacker who guessed the key (here: told it) and created one ring first: O_EXCL fails,
    the call is refused (rings), the rings already created are rolled back, the plant is not touched."""
    key = "0123456789abcdef"
    monkeypatch.setattr(calls_mod, "new_ring_key", lambda: key)
    table = CallTable(shm_clean, max_calls=4, ring_seconds=0.1)
    first = table.new_id()  # call ids are a counter: the next admission's is first + 1
    planted = SHM_DIR / ring_name(shm_clean, f"{first[:-5]}{int(first[-5:]) + 1:05d}", "tts", key)
    planted.write_bytes(b"planted")
    try:
        with pytest.raises(AdmissionError) as e:
            table.admit("native", "x", 8000, 16000)
        assert e.value.reason == "rings" and table.refused == {"rings": 1} and not table.calls
        assert planted.read_bytes() == b"planted"
        left = sorted(p.name for p in SHM_DIR.glob(f"brisvox.{shm_clean}.*"))
        assert left == [planted.name]
    finally:
        planted.unlink(missing_ok=True)


def test_create_is_exclusive_even_over_a_symlink(shm_clean: str, tmp_path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    name = ring_name(shm_clean, "sym", "in", new_ring_key())
    os.symlink(target, SHM_DIR / name)
    try:
        with pytest.raises(FileExistsError):
            Ring.create(name, 256, 8000)
        with pytest.raises(RingError, match="cannot open"):
            Ring.attach(name)  # O_NOFOLLOW: the link is never followed
        assert target.read_bytes() == b"keep"
    finally:
        (SHM_DIR / name).unlink()


def test_create_is_0600_whatever_the_umask(shm_clean: str) -> None:
    name = ring_name(shm_clean, "umask", "in", new_ring_key())
    old = os.umask(0o277)
    try:
        r = Ring.create(name, 256, 8000)
    finally:
        os.umask(old)
    try:
        assert (SHM_DIR / name).stat().st_mode & 0o777 == 0o600
        Ring.attach(name, 8000).close()
    finally:
        r.unlink()
        r.close()


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o606, 0o400])
def test_attach_refuses_a_segment_that_is_not_private(shm_clean: str, mode: int) -> None:
    name = ring_name(shm_clean, "mode", "in", new_ring_key())
    r = Ring.create(name, 256, 8000)  # a whole, valid ring: only its mode is wrong
    try:
        os.chmod(SHM_DIR / name, mode)
        with pytest.raises(RingError, match=f"mode {mode:04o}, expected 0600"):
            Ring.attach(name)
    finally:
        r.unlink()
        r.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's segment needs root to chown (see the module doc)")
def test_attach_refuses_another_users_segment(shm_clean: str) -> None:
    name = ring_name(shm_clean, "owner", "in", new_ring_key())
    r = Ring.create(name, 256, 8000)
    try:
        os.chown(SHM_DIR / name, 65534, 65534)
        with pytest.raises(RingError, match="owned by uid 65534"):
            Ring.attach(name)
    finally:
        r.unlink()
        r.close()


def test_the_sweep_removes_a_dead_instances_keyed_segments() -> None:
    dead = "999999997-00000001"
    names = [ring_name(dead, "c1", k, new_ring_key()) for k in ("in", "out")]
    rings = [Ring.create(n, 256, 8000) for n in names]
    for r in rings:
        r.close()
    try:
        sweep = sweep_segments(alive=lambda inst: inst != dead)
        assert set(names) <= set(sweep.removed)
        assert not any((SHM_DIR / n).exists() for n in names)
    finally:
        for n in names:
            (SHM_DIR / n).unlink(missing_ok=True)
