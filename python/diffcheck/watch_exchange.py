"""The one exchange of each dct.watch check: every rank's rows of hashes to
every rank, in one all-gather, that never hangs.

A rank that does not come must be named within the watch's timeout. gloo's
monitored barrier does it, but costs as much as the all-gather itself on
every check (two rounds through rank 0), and an all-gather left waiting with
a timeout cannot be taken back: the process group's threads keep it, and the
job's exit waits for them. So the ranks meet in the job's store first (the
key-value store of torch.distributed's rendezvous): each writes that it came
to check C and waits, at most `timeout` seconds, for every rank's key of C;
the store answers when the last one is written (a round trip each). When the
wait runs out the keys say which ranks never came, and no collective is left
behind. Each rank deletes its key of the check before (every rank is past it
by then: they all took part in its all-gather). Where torch has no such store
gloo's monitored barrier serves."""
import datetime
import itertools

import torch
import torch.distributed as dist

_WATCHES = itertools.count()  # the same on every rank: a watch is made by every rank of its group, in order


class Unanswered(RuntimeError):
    """A rank did not come within the timeout (watch.py raises it as dct.RankUnresponsive)."""


def _job_store():
    """torch.distributed's store of the default group (its rendezvous), or None."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


class Exchange:
    def __init__(self, group, rank, world, hosts, timeout):
        self.group, self.rank, self.world, self.hosts, self.timeout = group, rank, world, hosts, timeout
        self.store = _job_store()
        members = dist.get_process_group_ranks(group) if group is not None else range(world)
        self.prefix = f"diffcheck/watch{next(_WATCHES)}/" + "-".join(map(str, members))[:64]
        self.backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def gather(self, mine, check, when):
        """Every rank's rows (a list per rank of lists of ints) of this check,
        number `check`; `when` says which check in an error."""
        self._meet(check, when)
        mine = mine.to(self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine, group=self.group)
        return torch.stack(everyone).cpu().tolist()

    def _key(self, check, rank):
        return f"{self.prefix}/{check}/{rank}"

    def _meet(self, check, when):
        waited = f"diffcheck watch: rank {self.rank} waited {self.timeout:g} s at the check {when}"
        if self.store is None:
            if self.backend == "gloo":
                try:
                    dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=self.timeout))
                except RuntimeError as e:  # gloo names the rank: "Rank 1 failed to pass monitoredBarrier"
                    raise Unanswered(f"{waited}: {e}") from e
            return
        keys = [self._key(check, r) for r in range(self.world)]
        try:
            if check > 1:
                self.store.delete_key(self._key(check - 1, self.rank))
            self.store.set(keys[self.rank], "1")
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:  # DistStoreError: the wait ran out (or the store's host is gone)
            raise Unanswered(f"{waited}: {self._late(keys, e)}") from e

    def _late(self, keys, error):
        try:
            late = [r for r, k in enumerate(keys) if not self.store.check([k])]
        except RuntimeError:
            return f"the job's store does not answer ({error})"
        if not late:
            return f"every rank came to it, yet the wait ended ({error})"
        who = ", ".join(f"rank {r} ({self.hosts[r]})" for r in late)
        return f"{who} did not come to it ({'it has' if len(late) == 1 else 'they have'} not reached that step)"
