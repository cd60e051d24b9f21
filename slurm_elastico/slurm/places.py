"""The place kept for a requeued job: a reservation of its nodes, from before its requeue-hold until it runs again.

Between the hold and the restart the job's GPUs are free for at least the revocation gap, and Slurm starts
any pending job that fits there the moment the job ends: measured on 22.05, a plain pending `mps:100` job
took the GPU and the reshaped job stayed pending (Resources). So the gateway reserves the nodes for the
job's owner first (`commands.reserve_place`), puts the job into the reservation before its release, and
`Places` takes it out and deletes the reservation once it runs again. Trap: Slurm kills a job still running
inside a reservation when the reservation ends, so a place is never simply left to expire with the job in it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from slurm_elastico.errors import PlaceNotGivenUp, SlurmError, SlurmUnavailable, UnknownJobError
from slurm_elastico.model import JobState, JobView
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.runner import Completed

RESTART_TIMEOUT_S = 60.0
"""How long a requeued job, released, may take to run again on the place kept for it (`Places.kept`)."""
log = logging.getLogger(__name__)
_NOT_WAITING = tuple(s for s in JobState if s is not JobState.PENDING)
_NO_RESERVATION = re.compile(r"Requested reservation is invalid", re.IGNORECASE)
"""What `scontrol delete ReservationName=` says of a reservation that does not exist (ESLURM_RESERVATION_INVALID)."""
_RESERVATION_BUSY = re.compile(r"Requested reservation is in use", re.IGNORECASE)
"""What it says of one with a job in it (ESLURM_RESERVATION_BUSY)."""


class Places:
    """Makes, gives up and forgets the reservations that keep requeued jobs' places, through the gateway's
    `run` (an action: typed errors) and `wait_state` (polls a job until it is in one of the states)."""

    def __init__(self, run: Callable[[Sequence[str]], Completed],
                 wait_state: Callable[[int, Sequence[JobState], float], JobView]):
        self._run = run
        self._wait_state = wait_state

    def forget(self, job_id: int) -> None:
        """Delete the place a helper that died kept for the job (`kept`), first taking the job out of it if
        it is in there, so it neither waits for the reservation to end nor runs inside one that ends (Slurm kills
        a job still in a reservation when it ends: measured on 22.05). Recovery calls it for every interrupted
        reshape.

        Only that place is touched: the job is taken out of a reservation only when Slurm says the place is in
        use, so a job in any other one (a site's, its user's `--reservation`) stays there. No such place:
        nothing to do; still in use once the job is out (other jobs put into it): left to end by itself, logged.
        Any other refusal is raised, since a job left inside a place that ends is killed.
        """
        try:
            self._run(commands.delete_place(job_id))
            return
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            if _NO_RESERVATION.search(str(exc)):
                return
            if not _RESERVATION_BUSY.search(str(exc)):
                raise
        self.leave(job_id)  # the place has a job in it: this one, its only user

    def leave(self, job_id: int) -> None:
        """Take the job out of its place and delete the place (the job gone: the place all the same). Still in use
        once the job is out (someone put other jobs into it): the job is out, which is what matters; the place
        ends by itself, logged. Any other refusal is raised."""
        try:
            self._run(commands.set_reservation(job_id, ""))
        except UnknownJobError as exc:
            log.info("job %d is gone, nothing of it to take out of its place: %s", job_id, exc)
        try:
            self._run(commands.delete_place(job_id))
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            if not _RESERVATION_BUSY.search(str(exc)):
                raise
            log.warning("job %d is out of its place, which still holds other jobs: %s", job_id, exc)

    @contextmanager
    def kept(self, job_id: int, create: list[str]) -> Iterator[str | None]:
        """Keep the job's nodes for it alone (`create`: its `commands.reserve_place` argv) while the body runs
        and until it runs again.

        The running jobs go on, no other job starts there; the body puts the job into the reservation (the
        yielded name) before its release; once the job runs again (or after `RESTART_TIMEOUT_S`, an error) it is
        taken out of it and the reservation deleted, whatever happened. Where Slurm refuses the reservation (the
        nodes are already in another: a site's, or a place kept for another job at the same moment), it yields
        None and the job is requeued without one, as before. Measured with it: back on its GPU ~3 s after the
        hold, the competitor still pending. Other jobs wait for those nodes only these seconds. Should the
        helper die in between, the reservation ends by itself (the stop and restart timeouts, in whole minutes)
        and does not hold a job pending in it (`NO_HOLD_JOBS_AFTER_END`); but Slurm kills a job still running
        inside a reservation when it ends, so recovery takes the job out first (`forget`).
        """
        try:
            self._run(create)
        except SlurmUnavailable:
            raise
        except SlurmError:
            # One of this job's left by a helper that died: replace it. Any other refusal (the nodes are in
            # another reservation: a site's, or another job's place) leaves the job's place unkept, as before.
            self.forget(job_id)
            try:
                self._run(create)
            except SlurmUnavailable:
                raise
            except SlurmError:
                yield None
                return
        ok = False
        try:
            yield commands.place_name(job_id)
            ok = True  # carried out: held, updated, released; from here on nothing may report it failed
            try:
                self._wait_state(job_id, _NOT_WAITING, RESTART_TIMEOUT_S)
            except SlurmUnavailable:
                raise
            except SlurmError as exc:  # released with its new request: it starts when Slurm can, out of the place
                log.warning("job %d, reshaped and released, is not running again yet; its place is given up: %s",
                            job_id, exc)
        finally:
            try:
                self.leave(job_id)
            except SlurmError as exc:
                if ok:  # carried out: said so, and the reshape's row stays open for recovery to give the place up
                    raise PlaceNotGivenUp(exc.argv, exc.returncode, exc.stderr,
                                          f"job {job_id} was reshaped and released, but its place was not given up "
                                          f"(`{' '.join(exc.argv)}` exited with {exc.returncode})") from exc
                # The body's own error is raised; the reshape's row stays open and recovery gives the place up.
                log.warning("job %d: its place was not given up (%s); the next epoch's recovery does it", job_id, exc)
