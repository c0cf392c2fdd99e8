"""Writes on a thread of their own, so that the forward goes on while a tap
goes to disk (h5py lets go of the GIL while it writes). One write at a time:
a new one is prepared only when the previous one has finished, so at most one
tap's copy exists beyond what the model itself holds."""
import queue
import threading


class BackgroundWriter:
    def __init__(self, name="diffcheck-writer", queued=1):
        """`queued`: writes that may wait (prepared) beyond the one running;
        1 (the default) keeps at most one tap's copy alive."""
        self._slots = queued
        self._idle = threading.Semaphore(queued)
        self._jobs = queue.SimpleQueue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, prepare):
        """Waits for the previous write, then calls prepare() here (it copies
        what must not change meanwhile) and runs the function it returns on
        the thread. A failed earlier write is raised here."""
        self._idle.acquire()
        try:
            self._raise()
            job = prepare()
        except BaseException:
            self._idle.release()
            raise
        self._jobs.put(job)

    def close(self):
        """Waits for the last write and ends the thread; raises a failed write."""
        if self._thread is None:
            return
        for _ in range(self._slots):
            self._idle.acquire()
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
        for _ in range(self._slots):
            self._idle.release()
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
            try:
                job()
            except BaseException as e:  # raised in the caller's thread, at its next submit or close
                self._error = e
            finally:
                self._idle.release()
