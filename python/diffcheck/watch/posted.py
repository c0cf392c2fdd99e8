"""dct.watch's batched exchange (`exchange_every=` N or "auto") without a
wait: each batch's rows go from every rank to every other rank in
non-blocking sends and receives, and are read one batch later, when they have
long arrived. Every rank then holds the whole table and judges it itself, the
same way (diffcheck/watch/__init__.py), so no verdict travels.

Why: the hub's exchange (diffcheck/watch/exchange.py) waits twice a batch,
for the last rank to come to the check and for the hub's word back. On the
data-parallel MLP of docs/torch_measurements.md that was 2-3 ms a batch at 2
ranks, nearly all of it one rank waiting for the other to finish its hashes:
an imbalance the job's own next all-reduce waits for anyway, and which the
watch no longer adds to. What it gives up: a finding comes one batch later
than with the hub's exchange (docs/torch.md).

The hub's choice of the batch size ("auto") travels in the last element of
its message: posted at exchange k, read by every rank at exchange k+1, where
every rank (the hub too) starts using it, so the ranks' batches stay alike.
Two batches at most are on their way between a pair of ranks; their tags
alternate, so a message never matches the other batch's receive."""
import datetime

import torch
import torch.distributed as dist


class _Batch:
    """One batch's messages on their way: this rank's and the receive buffers of every other rank's."""

    def __init__(self, mine, theirs, works, shape, steps, transient, check, when):
        self.mine, self.theirs, self.works, self.shape = mine, theirs, works, shape
        self.steps, self.transient, self.check, self.when = steps, transient, check, when


class Posted:
    def __init__(self, exchange):
        self.x = exchange
        self.pending = None  # the batch posted at the last exchange, not yet read
        self.posted = 0  # batches posted: the tags alternate with it
        self._wait = datetime.timedelta(seconds=exchange.timeout)

    def post(self, rows, steps, transient, check, when, size):
        """This batch's rows (a torch int64 [check, row, 4]) and, from the hub,
        `size` (the checks a batch from the next exchange on) to every other
        rank, not waited for. Returns the batch posted before as read now
        ([] at the first): see read()."""
        x = self.x
        if x.store is not None:  # the number of the check each rank came to: names who never did (exchange.py)
            x.store.set(f"{x.prefix}{x.rank}", str(check))
        mine = torch.empty(rows.numel() + 1, dtype=torch.int64)
        mine[:-1] = rows.reshape(-1)
        mine[-1] = size
        others = [r for r in range(x.world) if r != x.rank]
        theirs = {r: torch.empty_like(mine) for r in others}
        tag = 1 + self.posted % 2
        self.posted += 1
        with x._named(check, when):
            works = [dist.isend(mine, dst=x.members[r], group=x.group, tag=tag) for r in others] + \
                [dist.irecv(theirs[r], src=x.members[r], group=x.group, tag=tag) for r in others]
        previous, self.pending = self.pending, _Batch(mine, theirs, works, tuple(rows.shape), steps, transient,
                                                      check, when)
        return self.read(previous)

    def drain(self):
        """The batch still on its way, read (waited for): [] if none. Collective."""
        pending, self.pending = self.pending, None
        return self.read(pending)

    def read(self, batch):
        """[(every rank's rows, a NumPy int64 [rank, check, row, 4]; the steps; this
        rank's transient findings; the hub's size)] of `batch`, once its messages
        are in (waited for at most the watch's timeout), or [] for None."""
        if batch is None:
            return []
        with self.x._named(batch.check, batch.when):
            for w in batch.works:
                w.wait(self._wait)
        table = torch.stack([batch.mine if r == self.x.rank else batch.theirs[r] for r in range(self.x.world)])
        size = int(table[0, -1])
        return [(table[:, :-1].reshape(self.x.world, *batch.shape).numpy(), batch.steps, batch.transient, size)]
