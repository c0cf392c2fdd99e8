"""The watch's reports (a mixin of diffcheck/watch/__init__.py's Watch): a
finding printed by rank 0 with the ranks it blames, every rank's piece of a
disagreeing tensor written for `diffcheck compare`, and then ReplicasDiffer
on every rank (on_mismatch="stop") or a warning ("warn").

In warn mode a finding that stays (the same tensor apart in the same replica
group, its ranks split the same way) is reported once, when it first
appears, and again only when it changes: a fault that persists for the rest
of a long job writes one report, not one per check. `watch.findings` holds
each report's findings; a finding seen again has its `last_step` moved on.
"""
import warnings

import torch.distributed as dist

from diffcheck.dump import RankDump
from diffcheck.watch.errors import ReplicasDiffer, TransientFault


class WatchReports:
    def _report(self, found, after, batch=1):
        if self.on_mismatch == "warn":
            found = self._changed(found)
            if not found:
                return
        self.findings += found
        # The check after the last step has a prefix of its own: it never overwrites the pieces of a
        # finding made before that step (close() after a caught ReplicasDiffer checks again).
        prefix = f"{self.out}.step{self.steps}" + (".after" if after else "")
        by_name = dict(self.params)
        pieces, written = [], set()
        with RankDump(prefix, self.mesh, self.rank, producer="diffcheck.torch watch") as d:
            for f in found:
                t = self._local(f["name"], f["value"](by_name[f["name"]]))
                pieces.append(t)
                if f["tensor"] in written:
                    continue  # one tensor apart in several replica groups: its piece is written once
                written.add(f["tensor"])
                attrs = {k: v for k, v in self._layout[f["name"]].items() if k in ("spec", "partial") and v}
                d.tap(f["tensor"], t, **attrs)
        firsts = self.exchange.first_differences([(f["base"], f["apart"]) if f["everywhere"] else None
                                                  for f in found], pieces)
        dist.barrier(group=self.group)
        step = found[0]["step"]  # (one check's findings: the first whose replicas differ)
        when = "after the last" if after and step == self.steps else f"before step {step}'s"
        later = "" if step == self.steps else (
            " (found at the exchange " + ("after the last optimizer step" if after else
                                         f"before step {self.steps}'s optimizer step")
            + f", {batch} checks exchanged at once: the pieces below are as they are then)")
        tensors = len({f["tensor"] for f in found})
        groups = f" in {len(found)} replica groups" if len(found) > tensors else ""
        lines = [f"diffcheck watch: replicas DIFFER {when} optimizer step{later}: {tensors} tensor(s){groups}"]
        for f, first in zip(found, firsts):
            lines.append(f"  {f['tensor']}: {self._who(f)}")
            for r, (index, base, theirs) in sorted(first.items()):
                lines.append(f"    first differing element: local index [{','.join(map(str, index))}], "
                             f"rank {f['base']}: {base:.9g}, rank {r}: {theirs:.9g}")
        lines.append(f"  the pieces: {prefix}.rank<R>.h5 (diffcheck compare {prefix})")
        message = "\n".join(lines)
        if self.rank == 0:
            print(message, flush=True)
            from diffcheck.compare import DiffcheckError, compare
            try:
                print(compare(prefix, check=False)["console"], end="", flush=True)
            except (DiffcheckError, FileNotFoundError) as e:  # the finding stands without the comparison
                print(f"  (diffcheck compare {prefix}: {e})", flush=True)
        if self.on_mismatch == "stop":
            raise ReplicasDiffer(message)
        warnings.warn(message, stacklevel=3)


    def _changed(self, found):
        """The findings not reported before in this form (warn mode): a tensor
        apart in a replica group whose ranks split as at the last report is
        not reported again; its finding's `last_step` moves on."""
        reported = self.__dict__.setdefault("_reported", {})  # (tensor, group) -> the finding last reported
        new = []
        for f in found:
            key = (f["tensor"], tuple(f["group"]))
            last = reported.get(key)
            if last is not None and last["classes"] == f["classes"]:
                last["last_step"] = f["step"]
                continue
            f["last_step"] = f["step"]
            reported[key] = f
            new.append(f)
        return new

    @staticmethod
    def _who(f):
        """The ranks a finding blames: the odd ones out where a majority agrees; else every
        rank of the group, by the value it holds (of two, either may be the wrong one)."""
        def rank(r):
            return f"rank {r} ({f['hosts'][r]})"
        if f["odd_one_out"]:
            one = len(f["apart"]) == 1
            return (f"{', '.join(map(rank, f['apart']))} {'is the odd one out' if one else 'are the odd ones out'} "
                    f"in replica group {f['group']}")
        return (f"replica group {f['group']} holds {len(f['classes'])} values with no majority: "
                + " against ".join(", ".join(map(rank, c)) for c in f["classes"]))

    def _report_transient(self, mine):
        """Rerun findings of any rank (each rank knows only its own details): collective."""
        details = [None] * self.world
        dist.all_gather_object(details, mine, group=self.group)
        lines = []
        for r, found in enumerate(details):
            for f in found or []:
                lines.append(f"  rank {r} ({self.hosts[r]}), step {f['step']}: module '{f['module']}' gave other bits "
                             f"when run again on the same inputs (first at flat index {f['index']}: {f['first']:.9g} "
                             f"then {f['again']:.9g})")
        message = (f"diffcheck watch: TRANSIENT fault (the rerun check) before step {self.steps}'s optimizer step:\n"
                   + "\n".join(lines))
        self.findings.append({"step": self.steps, "kind": "transient", "ranks": [r for r, f in enumerate(details) if f]})
        if self.rank == 0:
            print(message, flush=True)
        if self.on_mismatch == "stop":
            raise TransientFault(message)
        warnings.warn(message, stacklevel=3)
