"""The exchange of dct.watch's kept checks and their judgement (a mixin of
diffcheck/watch/__init__.py's Watch): the rows go to the hub, which compares
them (watch/exchange.py), and when some replica group's hashes differ the
first check of the batch that holds a finding is reported (watch/report.py)."""
import time

from diffcheck.watch.batches import first_apart
from diffcheck.watch.errors import RankUnresponsive
from diffcheck.watch.exchange import Unanswered
from diffcheck.watch.hashing import ALGORITHMS


class Judging:
    def _exchange_kept(self, after):
        """The kept checks' rows to the hub, its word back, and the first
        check with a finding reported (collective)."""
        self._check_shapes()
        rows, steps, transient = self._batches.take()
        n = rows.shape[1] - 1
        # The kept tables (one plan's: a batch is of one kind) are copied into `rows`: free to be filled again.
        # (Not the other plan's: a check that is not of the batch's kind is kept after this exchange.)
        next(plan for plan in self._rows.values() if plan.count == n).release()
        when = (f"before step {steps[-1]}'s optimizer step" if not after else "after the last optimizer step") + \
            (f" (with the checks before steps {', '.join(map(str, steps[:-1]))})" if len(steps) > 1 else "")
        start = time.perf_counter()
        try:
            table = self.exchange.collect(rows, self.checks, when)  # the hub's alone
            news = table is not None and (bool(table[:, :, -1, 0].any()) or
                                          bool(first_apart(table, self._leaders[:n]).any()))
            size = (self._batches.next_size(rows[0].numel() * 8, time.perf_counter() - start)
                    if table is not None else 1)
            everyone, self._batches.size = self.exchange.announce(news, table, self.checks, when, size)
        except Unanswered as e:
            raise RankUnresponsive(str(e)) from e
        if table is not None:
            self._batches.timed(time.perf_counter() - start)
        if everyone is not None:  # some replica group disagrees
            self._judge(everyone, steps, transient, after)

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
