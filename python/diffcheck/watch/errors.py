"""What dct.watch raises."""


class WatchError(RuntimeError):
    """What dct.watch raises: a finding (ReplicasDiffer) or a rank that never came (RankUnresponsive)."""


class ReplicasDiffer(WatchError):
    """Replicas of a tensor disagree (raised on every rank with on_mismatch="stop")."""


class RankUnresponsive(WatchError):
    """A rank did not come to a check within the watch's timeout (raised on the ranks that waited,
    naming those that did not come). No ReplicasDiffer: `except dct.ReplicasDiffer` must not swallow
    a stalled rank, whose job would then hang at its next collective."""


class TransientFault(ReplicasDiffer):
    """The rerun check found a rank computing other bits from the same inputs (raised on every rank)."""
