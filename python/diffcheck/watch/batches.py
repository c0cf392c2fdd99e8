"""dct.watch's checks exchanged several at a time (`exchange_every=`): each
check's rows of hashes are made at its step and kept; every N-th check (and
at close()) the kept rows travel to the hub together, and a finding still
names the step whose rows differ.

Why: the exchange is two round trips through the hub. Where the ranks share
cores, each costs a scheduling wait (0.4-0.6 ms a check at 2 ranks on 2
cores), 4% of the 15 ms step of examples/watch_train.py's tensor-parallel
block, while the hashes cost 0.1 ms. Exchanged N at a time, the round trips
cost 1/N as much; what is given up is the latency of a finding (found up to
N - 1 checks later) and the pieces written then are the tensors as they are
at that exchange, which the report says.

"auto": the hub times each exchange and the steps between checks, and sets
N so that the exchange costs at most BUDGET of the steps, within at most
MAX_DELAY_S of steps and MAX_KEPT_BYTES of kept rows. N travels with the
hub's answer, so every rank starts the next batch with the same N.

Not the default (exchange_every=1, every check exchanged at once): between
two exchanges no rank waits in the watch, so a rank that stops there leaves
the others waiting in the job's own next collective, not named within the
watch's timeout; and a finding comes later than its step."""
import math
import time

import numpy as np
import torch

# (0.25% before: a small model's whole check at every=1 is ~1% of its step, the exchange a small part of it)
BUDGET = 0.001  # the exchange's share of the steps that "auto" aims at
MAX_DELAY_S = 2.0  # the steps a finding may wait for its exchange, at most (in the hub's timing)
# (64 before: a small model's 11 ms steps then exchanged every 0.7 s, each exchange 2-4 ms of scheduling waits on
# 2 shared cores; MAX_DELAY_S bounds a finding's wait, MAX_KEPT_BYTES the rows kept)
MAX_CHECKS = 256
MAX_KEPT_BYTES = 16 << 20


def parse(exchange_every):
    """None ("auto") or a fixed number of checks per exchange; ValueError otherwise."""
    if exchange_every == "auto":
        return None
    if isinstance(exchange_every, bool) or not isinstance(exchange_every, int) or exchange_every < 1:
        raise ValueError(f"watch(exchange_every={exchange_every!r}): 'auto' or a number of checks, 1 or more")
    return exchange_every


def planned_size(exchange_s, interval_s, row_bytes):
    """Checks per exchange for an exchange of `exchange_s` seconds and checks
    `interval_s` apart: the fewest that keep the exchange within BUDGET of the
    steps, no more than MAX_DELAY_S of steps, MAX_CHECKS or MAX_KEPT_BYTES."""
    cap = max(1, min(MAX_CHECKS, MAX_KEPT_BYTES // max(row_bytes, 1),
                     int(MAX_DELAY_S / interval_s) if interval_s > 0 else MAX_CHECKS))
    if interval_s <= 0:
        return cap
    return max(1, min(cap, math.ceil(exchange_s / (BUDGET * interval_s))))


class Batches:
    def __init__(self, exchange_every):
        self.fixed = parse(exchange_every)
        self.size = self.fixed or 1  # checks per exchange now: every rank the same (the hub's word)
        self.kept = []  # (rows [R+1, 4] int64, step, transient findings of that check)
        # From the watch's start: the first batch's "interval" is then the first step and all before it
        # since the watch began, never less than a step, so the second batch, planned at the first
        # exchange (with that exchange's time so far: next_size), waits no longer than MAX_DELAY_S. One
        # warm-up exchange of one check fewer: ~0.2% of a 40-step window at 4 ranks.
        self._last_take, self._takes = time.perf_counter(), 0
        self._interval = None  # seconds between checks (smoothed), the hub's
        self._exchange = None  # seconds an exchange took (smoothed), the hub's

    def keep(self, rows, step, transient):
        """A check's rows (a NumPy array, the check's own until the batch is taken:
        hashing.CheckRows); True when the batch is due."""
        self.kept.append((rows, step, transient))
        return len(self.kept) >= self.size

    def take(self):
        """(rows [n, R+1, 4], the steps, every transient finding) of the kept checks, emptied. The
        time between checks is measured here, once a batch, as the time since the last batch over
        its checks (a clock read at every check was ~3 us of a check in a training loop)."""
        kept, self.kept = self.kept, []
        now = time.perf_counter()
        if kept:
            measured = (now - self._last_take) / len(kept)
            # the first measure (the set-up with the first step) is replaced by the second, not smoothed into it
            self._interval = _smoothed(self._interval, measured) if self._takes >= 2 else measured
            self._takes += 1
        self._last_take = now
        return (torch.from_numpy(np.stack([r for r, _, _ in kept])), [s for _, s, _ in kept],
                [t for _, _, ts in kept for t in ts])

    def timed(self, seconds):
        """The hub: an exchange took `seconds`."""
        self._exchange = _smoothed(self._exchange, seconds)

    def next_size(self, row_bytes, so_far):
        """The hub's choice for the next batch (the fixed number, if given);
        `so_far`: the seconds this exchange has taken until now (its rows
        in), which stand for an exchange's time until one has been timed
        whole: the first exchange then plans the second batch."""
        if self.fixed is not None:
            return self.fixed
        if self._interval is None:
            return 1
        return planned_size(self._exchange if self._exchange is not None else so_far, self._interval, row_bytes)


def _smoothed(old, new):
    return new if old is None else 0.7 * old + 0.3 * new


def first_apart(table, leaders):
    """Per kept check, whether some replica group's rows differ: table [rank, check, row, 4]
    (the hub's), leaders [row, rank] (each rank's group leader for that row)."""
    n = leaders.shape[0]
    rows = table[:, :, :n]
    theirs = rows[leaders.T[:, None, :], np.arange(rows.shape[1])[None, :, None], np.arange(n)[None, None, :]]
    return (rows != theirs).any(axis=(0, 2, 3))
