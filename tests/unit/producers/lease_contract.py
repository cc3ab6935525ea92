"""One contract for every LeaseManager adapter: subclass it once per backend.

A subclass provides :meth:`manager` (a writer named ``holder`` on the shared backend)
and :meth:`expire` (the run's lease runs out now); one whose managers hold asyncio
resources closes them in :meth:`aclean`. Every case runs on both faces of the port
(``[sync]``: acquire/verify/release; ``[async]``: aacquire/averify/arelease on an event
loop, see :mod:`tests.unit.producers.faces`): the async face behaves exactly like the sync one.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import cast

import pytest

from runlog.producers.log._lease import LeaseHeld, LeaseManager
from runlog.schemas.errors import LeaseLost

from .faces import FACES, Face


class LeaseContract:
    def manager(self, holder: str) -> LeaseManager:
        raise NotImplementedError

    def expire(self, run_id: str) -> None:
        raise NotImplementedError

    async def aclean(self) -> None:
        """Close what the managers opened on the async case's loop (called on it, at the end)."""

    @pytest.fixture(autouse=True)
    def _run(self) -> None:
        self.run = f"run-{uuid.uuid4().hex}"

    @pytest.fixture(params=FACES, ids=repr)
    def face(self, request: pytest.FixtureRequest) -> Face:
        return cast(Face, request.param)

    def test_a_lease_names_its_run_holder_and_first_epoch(self, face: Face) -> None:
        async def case() -> None:
            lease = await face.acquire(self.manager("a"), self.run)
            assert (lease.run_id, lease.holder, lease.epoch) == (self.run, "a", 1)
            lease.check()
            await face.verify(lease)
            assert lease.heartbeat()
            await face.release(lease)

        face.run(case, self.aclean)

    def test_epochs_only_grow_whoever_acquires(self, face: Face) -> None:
        async def case() -> None:
            a, b = self.manager("a"), self.manager("b")
            epochs = []
            for m in (a, b, a):
                lease = await face.acquire(m, self.run)
                epochs.append(lease.epoch)
                await face.release(lease)
            assert epochs == [1, 2, 3]

        face.run(case, self.aclean)

    def test_the_epoch_given_raises_the_counter_and_never_lowers_it(self, face: Face) -> None:
        async def case() -> None:
            m = self.manager("a")
            epochs = []
            for seen in (6, 0, 2):
                lease = await face.acquire(m, self.run, epoch=seen)
                epochs.append(lease.epoch)
                await face.release(lease)
            assert epochs == [7, 8, 9]

        face.run(case, self.aclean)

    def test_another_holder_is_refused_unless_it_forces(self, face: Face) -> None:
        async def case() -> None:
            a = await face.acquire(self.manager("a"), self.run)
            b = self.manager("b")
            with pytest.raises(LeaseHeld) as info:
                await face.acquire(b, self.run)
            assert info.value.run_id == self.run and info.value.holder.startswith("a")
            await face.verify(a)  # a refused acquire takes nothing from the holder
            taken = await face.acquire(b, self.run, force=True)
            assert taken.epoch == 2
            with pytest.raises(LeaseLost) as lost:
                await face.verify(a)
            assert (lost.value.run_id, lost.value.epoch) == (self.run, 1)
            with pytest.raises(LeaseLost):
                a.check()  # once lost, the local check knows it too
            assert not a.heartbeat()
            await face.verify(taken)
            await face.release(taken)

        face.run(case, self.aclean)

    def test_leases_of_other_runs_are_independent(self, face: Face) -> None:
        async def case() -> None:
            a = await face.acquire(self.manager("a"), self.run)
            other = await face.acquire(self.manager("b"), self.run + "-2")
            assert other.epoch == 1
            await face.verify(a)
            await face.verify(other)
            await face.release(a)
            await face.release(other)

        face.run(case, self.aclean)

    def test_release_frees_the_run_and_ends_the_lease(self, face: Face) -> None:
        async def case() -> None:
            a = await face.acquire(self.manager("a"), self.run)
            await face.release(a)
            await face.release(a)  # twice is harmless
            with pytest.raises(LeaseLost):
                a.check()
            with pytest.raises(LeaseLost):
                await face.verify(a)
            assert not a.heartbeat()
            b = await face.acquire(self.manager("b"), self.run)  # no force needed
            assert b.epoch == 2
            await face.verify(b)
            await face.release(b)

        face.run(case, self.aclean)

    def test_a_taken_over_holder_releasing_leaves_the_new_holder_alone(self, face: Face) -> None:
        async def case() -> None:
            a = await face.acquire(self.manager("a"), self.run)
            b = await face.acquire(self.manager("b"), self.run, force=True)
            await face.release(a)
            with pytest.raises(LeaseHeld):
                await face.acquire(self.manager("c"), self.run)
            await face.verify(b)
            await face.release(b)

        face.run(case, self.aclean)

    def test_an_expired_lease_is_free_to_take_and_lost_to_its_holder(self, face: Face) -> None:
        async def case() -> None:
            a = await face.acquire(self.manager("a"), self.run)
            self.expire(self.run)
            b = await face.acquire(self.manager("b"), self.run)  # no force needed
            assert b.epoch == 2
            assert not a.heartbeat()
            with pytest.raises(LeaseLost):
                await face.verify(a)
            with pytest.raises(LeaseLost):
                a.check()
            await face.verify(b)
            await face.release(b)

        face.run(case, self.aclean)

    def test_both_faces_act_on_one_lease_table(self) -> None:
        async def case() -> None:
            a = self.manager("a").acquire(self.run)  # sync holder
            b = self.manager("b")
            with pytest.raises(LeaseHeld):
                await b.aacquire(self.run)
            await a.averify()
            taken = await b.aacquire(self.run, force=True)  # async taker-over
            assert taken.epoch == 2
            with pytest.raises(LeaseLost):
                await a.averify()
            with pytest.raises(LeaseLost):
                a.verify()
            await a.arelease()  # the old holder's release leaves the new one alone
            taken.verify()
            await taken.arelease()
            again = self.manager("c").acquire(self.run)  # freed by the async release
            assert again.epoch == 3
            await again.arelease()
            with pytest.raises(LeaseLost):
                again.verify()

        async def main() -> None:
            try:
                await case()
            finally:
                await self.aclean()

        asyncio.run(main())
