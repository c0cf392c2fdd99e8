"""The exchange of dct.watch's kept checks and their judgement (a mixin of
diffcheck/watch/__init__.py's Watch): the rows go through the hub and are
waited for (exchange_every=1, watch/exchange.py), or are posted to every rank
and read one batch later (any other exchange_every, watch/posted.py); then
the first check of a batch whose replica groups hold different hashes is
reported (watch/report.py)."""
import time

from diffcheck.watch.batches import first_apart
from diffcheck.watch.errors import RankUnresponsive
from diffcheck.watch.exchange import Unanswered
from diffcheck.watch.hashing import ALGORITHMS


class Judging:
    def _exchange_kept(self, after, drain=True):
        """The kept checks exchanged, and the first check with a finding
        reported (collective). Posted (watch/posted.py): the batch posted
        before is read and judged; with drain this one too, waited for."""
        if not self._batches.kept:  # (close(), with only a posted batch left)
            read = self._posted.drain() if self._posted is not None else []
            return self._judge_read(read, after)
        rows, steps, transient = self._batches.take()
        n = rows.shape[1] - 1
        when = (f"before step {steps[-1]}'s optimizer step" if not after else "after the last optimizer step") + \
            (f" (with the checks before steps {', '.join(map(str, steps[:-1]))})" if len(steps) > 1 else "")
        if self._posted is not None:
            return self._posted_exchange(rows, steps, transient, when, after, drain)
        start = time.perf_counter()
        try:
            table = self.exchange.collect(rows, self.checks, when)  # the hub's alone
            news = table is not None and self._news(table, n)
            size = self._batches.next_size(rows[0].numel() * 8) if table is not None else 1
            everyone, self._batches.size = self.exchange.announce(news, table, self.checks, when, size)
        except Unanswered as e:
            raise RankUnresponsive(str(e)) from e
        if table is not None:
            self._batches.timed(time.perf_counter() - start)
        if everyone is not None:  # some replica group disagrees
            self._judge(everyone, steps, transient, after)

    def _posted_exchange(self, rows, steps, transient, when, after, drain):
        start = time.perf_counter()
        size = self._batches.next_size(rows[0].numel() * 8) if self.rank == 0 else 0
        try:
            read = self._posted.post(rows, steps, transient, self.checks, when, size)
            # A finding's report is collective work: nothing may be on its way then
            if drain or any(self._news(table, table.shape[2] - 1) for table, *_ in read):
                read += self._posted.drain()
        except Unanswered as e:
            raise RankUnresponsive(str(e)) from e
        if self.rank == 0:
            self._batches.timed(time.perf_counter() - start)
        self._judge_read(read, after)

    def _judge_read(self, read, after):
        """Posted batches read (watch/posted.py), in order: the hub's size taken
        up (by every rank at the same exchange), each batch with news judged."""
        for table, steps, transient, size in read:
            self._batches.size = size or self._batches.size
        for table, steps, transient, _ in read:
            if self._news(table, table.shape[2] - 1):
                self._judge(table, steps, transient, after)

    def _news(self, table, n):
        """Whether a table [rank, check, row, 4] holds a finding: a rerun's, or replicas apart."""
        return bool(table[:, :, -1, 0].any()) or bool(first_apart(table, self._leaders[:n]).any())

    def _judge(self, everyone, steps, transient, after):
        """The first check of the table whose replica groups differ reported, after any rerun finding."""
        names = self._names[:everyone.shape[2] - 1]
        found = []
        for c, step in enumerate(steps):  # the first check whose replicas differ
            for i, kind, name, value, g, rows_of in self._apart(everyone[:, c], names):
                self._same_algorithm(kind, name, rows_of)
                found.append(self._finding(kind, name, g, rows_of, value, step))
            if found:
                break
        if everyone[:, :, -1, 0].any():
            self._report_transient(transient)
        if found:
            self._report(found, after, len(steps))

    def _apart(self, everyone, names):
        """(index, kind, name, value, group, {rank: row}) of every replica group whose rows differ."""
        for i, (kind, name, value) in enumerate(names):
            for g in self._groups[name]:
                rows = {r: tuple(everyone[r][i]) for r in g}
                if len(set(rows.values())) > 1:
                    yield i, kind, name, value, g, rows

    def _same_algorithm(self, kind, name, rows):
        """Hashes made two ways never agree: refused (on every rank, which all see
        the same rows) rather than reported as replicas apart."""
        made = {r: row[2] for r, row in rows.items() if row[3]}
        if len(set(made.values())) > 1:
            ways = "; ".join(f"rank {r}: {ALGORITHMS.get(a, a)}" for r, a in made.items())
            raise ValueError(f"rank {self.rank}: watch(): the replicas of {kind}/{name} were hashed in different ways "
                             f"({ways}), which cannot be compared: give every rank the same kind of device and the "
                             "same diffcheck installation")

    def _finding(self, kind, name, group, rows, value, step):
        counts = {}
        for h in rows.values():
            counts[h] = counts.get(h, 0) + 1
        majority = max(counts.values())
        common = [h for h, n in counts.items() if n == majority]
        # The odd ones out: ranks whose hash fewer hold (with two, or a tie, every rank apart from the first).
        base = common[0] if len(common) == 1 else rows[group[0]]
        apart = [r for r in group if rows[r] != base]
        classes = {}  # the ranks of each hash, in the group's order
        for r in group:
            classes.setdefault(rows[r], []).append(r)
        return {"step": step, "found_at": self.steps, "kind": kind, "tensor": f"{kind}/{name}", "name": name,
                "group": group, "classes": list(classes.values()),
                "value": value, "base": next(r for r in group if rows[r] == base),
                "apart": apart, "odd_one_out": len(common) == 1 and len(group) >= 3,
                "everywhere": all(row[3] for row in rows.values()),  # every rank of the group has the tensor
                "hosts": {r: self.hosts[r] for r in group}}
