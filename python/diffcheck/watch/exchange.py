"""The exchange of each dct.watch check: every rank's rows of hashes to the
group's first rank (the hub), which compares them and tells every rank in a
few bytes whether any differ (then, rarely, the whole table follows), and
never a hang.

Why a hub: with the ranks sharing cores (2 cores, 4 ranks), gloo's ring
all-gather costs 3.8 ms a check, its gather then broadcast 2.0 ms, sends and
receives through one rank 0.8 ms (0.4 ms at 2 ranks): the ring's 3 steps each
wait for a rank to be scheduled. The hub's inbound is every rank's rows
(32 bytes per tensor and rank); what it sends back is 8 bytes per rank.

Why its own gloo group: a rank that does not come must be named within the
watch's timeout. gloo's monitored barrier names it, but is a second round
trip on every check; a receive waited on with a timeout of one's own cannot
be taken back (the process group's threads keep it, and the job's exit waits
for them); a meeting in the job's store costs 10 ms a check where that store
is a file (it polls). A group whose timeout is the watch's has gloo itself end
what a rank never joins, leaving nothing pending. Before each check each rank
writes the number of the check it came to in the job's store (one write);
when the exchange fails those numbers name the ranks that never came. The
hashes travel on the CPU, whatever the job's own backend."""
import contextlib
import datetime
import itertools

import torch
import torch.distributed as dist

from diffcheck.watch.rerun import first_difference

_WATCHES = itertools.count()  # the same on every rank: a watch is made by every rank of its group, in order


class Unanswered(RuntimeError):
    """A rank did not come within the timeout (diffcheck/watch raises it as dct.RankUnresponsive)."""


def _job_store():
    """torch.distributed's store of the default group (its rendezvous), or None."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


class Exchange:
    def __init__(self, group, rank, world, hosts, timeout):
        self.rank, self.world, self.hosts, self.timeout = rank, world, hosts, timeout
        self.store = _job_store()
        self.members = dist.get_process_group_ranks(group) if group is not None else list(range(world))
        self.prefix = f"diffcheck/watch{next(_WATCHES)}/" + "-".join(map(str, self.members))[:64] + "/rank"
        # Only the members make it (the watch is made by its group's ranks alone).
        self.group = dist.new_group(self.members, backend="gloo", timeout=datetime.timedelta(seconds=timeout),
                                    use_local_synchronization=True)

    def collect(self, mine, check, when):
        """The hub (rank 0 of the group): every rank's rows, an int64 array
        [rank, check, row, 4] (mine: [check, row, 4]); the other ranks: None. `check` numbers this check, `when`
        says which it is in an error."""
        if self.store is not None:
            self.store.set(f"{self.prefix}{self.rank}", str(check))
        with self._named(check, when):
            if self.rank != 0:
                dist.send(mine, dst=self.members[0], group=self.group)
                return None
            table = torch.empty(self.world, *mine.shape, dtype=mine.dtype)
            table[0] = mine
            for w in [dist.irecv(table[r], src=self.members[r], group=self.group) for r in range(1, self.world)]:
                w.wait()
            return table.numpy()

    def announce(self, news, table, check, when, size=1):
        """The hub's word to every rank: whether there is news (a finding,
        collective work ahead; then the whole table follows) and `size`, the
        checks the next exchange will bring (diffcheck/watch/batches.py).
        Returns (the table on every rank, or None without news; the size)."""
        flag = torch.tensor([1 if news else 0, size], dtype=torch.int64)
        with self._named(check, when):
            if self.rank == 0:
                for w in [dist.isend(flag, dst=self.members[r], group=self.group) for r in range(1, self.world)]:
                    w.wait()
            else:
                dist.recv(flag, src=self.members[0], group=self.group)
            size = int(flag[1])
            if not int(flag[0]):
                return None, size
            shape = torch.tensor(table.shape if self.rank == 0 else [0] * 4, dtype=torch.int64)
            dist.broadcast(shape, src=self.members[0], group=self.group)
            full = torch.as_tensor(table, dtype=torch.int64) if self.rank == 0 else torch.empty(*shape.tolist(),
                                                                                             dtype=torch.int64)
            dist.broadcast(full, src=self.members[0], group=self.group)
            return full.numpy(), size

    def first_differences(self, pairs, pieces):
        """For each finding, (base rank, apart ranks) or None, and this rank's
        piece of its tensor: the base rank sends its piece to each apart rank,
        which finds the first element whose bits differ from its own. Returns,
        on every rank, per finding {apart rank: (local index, the base's value,
        its value)}. Collective; only after a finding (the pieces travel)."""
        mine = []
        for pair, piece in zip(pairs, pieces):
            got = {}
            if pair is not None:
                base, apart = pair
                piece = piece.detach().contiguous().cpu()
                if self.rank == base:
                    for r in apart:
                        dist.send(piece, dst=self.members[r], group=self.group)
                elif self.rank in apart:
                    theirs = torch.empty_like(piece)
                    dist.recv(theirs, src=self.members[base], group=self.group)
                    d = first_difference(theirs, piece)
                    if d is not None:
                        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(d[0]), piece.shape)) \
                            if piece.dim() else ()
                        got[self.rank] = (index, d[1], d[2])
            mine.append(got)
        everyone = [None] * self.world
        dist.all_gather_object(everyone, mine, group=self.group)
        return [{r: v for e in everyone for r, v in e[i].items()} for i in range(len(pairs))]

    @contextlib.contextmanager
    def _named(self, check, when):
        """gloo's timeout (or a rank gone) raised as Unanswered, naming who never came."""
        try:
            yield
        except Unanswered:
            raise
        except RuntimeError as e:
            raise Unanswered(f"diffcheck watch: rank {self.rank} waited {self.timeout:g} s at the check {when}: "
                             f"{self._late(check, e)}") from e

    def _late(self, check, error):
        if self.store is None:
            return f"some rank did not come to it (this torch has no job store to say which: {error})"
        try:
            came = [int(self.store.get(k)) if self.store.check([k]) else 0
                    for k in (f"{self.prefix}{r}" for r in range(self.world))]
        except RuntimeError:
            return f"the job's store does not answer ({error})"
        late = [r for r in range(self.world) if came[r] < check]
        if not late:
            return f"every rank came to it, yet the exchange failed ({error})"
        who = ", ".join(f"rank {r} ({self.hosts[r]})" for r in late)
        return f"{who} did not come to it ({'it has' if len(late) == 1 else 'they have'} not reached that step)"
