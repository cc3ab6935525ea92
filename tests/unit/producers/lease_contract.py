"""One contract for every LeaseManager adapter: subclass it once per backend.

A subclass provides :meth:`manager` (a writer named ``holder`` on the shared backend)
and :meth:`expire` (the run's lease runs out now).
"""

from __future__ import annotations

import uuid

import pytest

from producers._lease import LeaseHeld, LeaseManager
from schemas.errors import LeaseLost


class LeaseContract:
    def manager(self, holder: str) -> LeaseManager:
        raise NotImplementedError

    def expire(self, run_id: str) -> None:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _run(self) -> None:
        self.run = f"run-{uuid.uuid4().hex}"

    def test_a_lease_names_its_run_holder_and_first_epoch(self) -> None:
        lease = self.manager("a").acquire(self.run)
        assert (lease.run_id, lease.holder, lease.epoch) == (self.run, "a", 1)
        lease.check()
        lease.verify()
        assert lease.heartbeat()
        lease.release()

    def test_epochs_only_grow_whoever_acquires(self) -> None:
        a, b = self.manager("a"), self.manager("b")
        epochs = []
        for m in (a, b, a):
            lease = m.acquire(self.run)
            epochs.append(lease.epoch)
            lease.release()
        assert epochs == [1, 2, 3]

    def test_min_epoch_raises_the_counter_and_never_lowers_it(self) -> None:
        m = self.manager("a")
        epochs = []
        for floor in (7, 1, 3):
            lease = m.acquire(self.run, min_epoch=floor)
            epochs.append(lease.epoch)
            lease.release()
        assert epochs == [7, 8, 9]

    def test_another_holder_is_refused_unless_it_forces(self) -> None:
        a = self.manager("a").acquire(self.run)
        b = self.manager("b")
        with pytest.raises(LeaseHeld) as info:
            b.acquire(self.run)
        assert info.value.run_id == self.run and info.value.holder.startswith("a")
        a.verify()  # a refused acquire takes nothing from the holder
        taken = b.acquire(self.run, force=True)
        assert taken.epoch == 2
        with pytest.raises(LeaseLost) as lost:
            a.verify()
        assert (lost.value.run_id, lost.value.epoch) == (self.run, 1)
        with pytest.raises(LeaseLost):
            a.check()  # once lost, the local check knows it too
        assert not a.heartbeat()
        taken.verify()
        taken.release()

    def test_leases_of_other_runs_are_independent(self) -> None:
        a = self.manager("a").acquire(self.run)
        other = self.manager("b").acquire(self.run + "-2")
        assert other.epoch == 1
        a.verify()
        other.verify()
        a.release()
        other.release()

    def test_release_frees_the_run_and_ends_the_lease(self) -> None:
        a = self.manager("a").acquire(self.run)
        a.release()
        a.release()  # twice is harmless
        with pytest.raises(LeaseLost):
            a.check()
        with pytest.raises(LeaseLost):
            a.verify()
        assert not a.heartbeat()
        b = self.manager("b").acquire(self.run)  # no force needed
        assert b.epoch == 2
        b.verify()
        b.release()

    def test_a_taken_over_holder_releasing_leaves_the_new_holder_alone(self) -> None:
        a = self.manager("a").acquire(self.run)
        b = self.manager("b").acquire(self.run, force=True)
        a.release()
        with pytest.raises(LeaseHeld):
            self.manager("c").acquire(self.run)
        b.verify()
        b.release()

    def test_an_expired_lease_is_free_to_take_and_lost_to_its_holder(self) -> None:
        a = self.manager("a").acquire(self.run)
        self.expire(self.run)
        b = self.manager("b").acquire(self.run)  # no force needed
        assert b.epoch == 2
        assert not a.heartbeat()
        with pytest.raises(LeaseLost):
            a.verify()
        with pytest.raises(LeaseLost):
            a.check()
        b.verify()
        b.release()
