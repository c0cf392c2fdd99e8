"""Writes on a thread of their own, so that the forward goes on while a tap
goes to disk (HDF5's C calls, made through ctypes by h5_direct.py, let go of
the interpreter lock while they write). A whole tap's write
is prepared only when a slot is free (by default one: a new one is prepared
only when the previous one has finished, so at most one tap's copy exists
beyond what the model itself holds); a small job (a sketch's few rows) is
queued without waiting. Jobs run in the order they were submitted."""
import queue
import threading


class _Small:
    def __init__(self, job):
        self.job = job


class BackgroundWriter:
    def __init__(self, name="diffcheck-writer", queued=1):
        """`queued`: whole-tap writes that may be prepared and waiting beyond
        the one running (1: one at a time)."""
        self._idle = threading.Semaphore(queued)
        self._jobs = queue.SimpleQueue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, prepare):
        """Waits for a free slot, then calls prepare() here (it copies what
        must not change meanwhile) and runs the function it returns on the
        thread. A failed earlier write is raised here."""
        while not self._idle.acquire(timeout=1.0):  # a writer thread that died must not hang the model
            if not self._thread.is_alive():
                raise RuntimeError("diffcheck's writer thread has ended: no more taps can be written")
        try:
            self._raise()
            job = prepare()
        except BaseException:
            self._idle.release()
            raise
        self._jobs.put(job)

    def submit_small(self, job):
        """Queues `job`, which holds only small arrays, without waiting for
        the writes before it. A failed earlier write is raised here."""
        self._raise()
        self._jobs.put(_Small(job))

    def close(self):
        """Waits for the last write and ends the thread; raises a failed write."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
        self._raise()

    def _raise(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            small = isinstance(job, _Small)
            try:
                (job.job if small else job)()
            except BaseException as e:  # raised in the caller's thread, at its next submit or close
                self._error = e
            finally:
                if not small:
                    self._idle.release()
