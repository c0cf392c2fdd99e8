"""The writing half of a capture (diffcheck/torch/session.py's Capture): a tap's
layout checked, its rounding counts added, and its values handed to the
writer thread — whole (copied if the model may change them; a device
tensor's through host staging, staging.py), or as a sketch
(sketch_capture.py). A mixin: the state it uses is the Capture's."""
import math
import numpy as np
import torch

from diffcheck.dump import to_numpy
from diffcheck.dump.layouts import check_layout, dtensor_layout, is_dtensor
from diffcheck.torch.data_axes import is_parameter_tap, with_data_axes
from diffcheck.torch.mesh_aliases import with_aliases

TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                torch.float16: "float16"}


def logical_dtype(tensor):
    return TORCH_DTYPES.get(tensor.dtype, str(tensor.dtype).replace("torch.", ""))


class TapWriting:
    def _model_dtype(self):
        for p in self.model.parameters():
            if p.is_floating_point():
                return TORCH_DTYPES.get(p.dtype)
        return None

    def _count_dtype(self, name, tensor):
        """Counts the dtypes of the activation taps (the run's dtype, close_writer)."""
        if tensor.is_floating_point() and not is_parameter_tap(name) and not name.startswith("grad/"):
            counts = self.__dict__.setdefault("_tap_dtypes", {})
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + 1

    def close_writer(self, writer):
        """Closes the file, its root `dtype` the one most activation taps
        were computed in: under mixed precision (FSDP2's policy, a model that
        casts its float32 parameters down) that is not the parameters', and
        the one-device yardstick in the compute dtype must pair with it.
        capture(dtype=...) is kept as given; a reference keeps its own."""
        left_out = self._library.untapped() if getattr(self, "_library", None) is not None else None
        if left_out:  # the report says what was not tapped, and why (also warned when the capture closes)
            writer.set_root_attrs(left_out=left_out)
        counts = getattr(self, "_tap_dtypes", None)
        if counts and not self._dtype_given and not self.reference_mode:
            most = TORCH_DTYPES.get(max(counts, key=counts.get))
            if most is not None and most != self.root_attrs.get("dtype"):
                writer.set_root_attrs(dtype=most)
        writer.close()

    def _check_layout(self, name, tensor, pattern, attrs):
        where = f"rank {self.rank}: tap '{name}' (shape {tuple(tensor.shape)})" + \
            (f", layout '{pattern}'" if pattern else "")
        # A complex output's real view: the layout names the complex tensor's dimensions.
        ndim = tensor.dim() - (1 if getattr(tensor, "_diffcheck_complex", False) else 0)
        check_layout(where, attrs, ndim, self.axes, self.mesh)

    def _write(self, name, tensor, plain_names, explicit=None, watch=False, inferred=None):
        """Tap `name`: its layout `explicit`, or the layouts' for `plain_names`,
        or what `inferred()` says ((attrs, what says so): a library's,
        library_plans.py, or a DTensor plan's, dtensor_plan.py) where no
        layout matches; `watch`: also its gradient (a module output under backward=True)."""
        pattern, attrs = (None, explicit) if explicit is not None else self._layout_for(*plain_names)
        if pattern is None and explicit is None and inferred is not None and not is_dtensor(tensor):
            attrs, pattern = inferred()
        if self._plan is not None and not is_dtensor(tensor):
            self._plan.remember(tensor, attrs)
        if watch and self.gradients is not None:
            self.gradients.watch(name, tensor, attrs, pattern)
        self._write_now(name, tensor, attrs, pattern)

    def _write_now(self, name, tensor, attrs, pattern=None):
        if self.only is not None and name not in self.only:
            return
        self._count_dtype(name, tensor)
        local = dtensor_layout(tensor, list(self.axis_sizes))
        if local is not None:  # a DTensor: its shard, laid out as its placements say (unless a layout does)
            tensor, placed = local
            if "spec" not in attrs and "partial" not in attrs:  # counts alone (a gradient's) keep the placements
                attrs = {**attrs, **with_aliases(placed, getattr(self, "aliases", None))}
        if self.reference_mode or self.one_device:  # global tensors: no layout to say
            attrs = {}
        else:
            if self.data_axes and not is_parameter_tap(name):  # each data-parallel rank its own samples
                attrs = with_data_axes(attrs, tuple(tensor.shape), self.data_axes, self._local_batch)
            if self._library and not is_parameter_tap(name):  # what libraries imply (library_plans.py)
                attrs = self._library.attrs(name, attrs, tuple(tensor.shape), pattern)
                if attrs is None or (self.sketches is not None and self._library.sketch_leaves_out(name, attrs)):
                    return  # a value no layout describes, or a tap of streams in sketch mode (named at the close)
            self._check_layout(name, tensor, pattern, attrs)
            if self.derive_depths:
                attrs = self._with_counts(name, tensor, attrs)
        hand = getattr(self, "hand", None)
        if hand is not None and not self.reference_mode:  # a pipeline written by hand (hand_pipeline.py)
            attrs = hand.staged(name, attrs)
            if hand.hold(name, tensor, attrs):
                return
        pipeline = getattr(self, "pipeline", None)
        if pipeline is not None and pipeline.hold(name, tensor, attrs):  # a microbatch's: written at the step's end
            return
        if pipeline is not None:
            attrs = {**attrs, "order": pipeline.order_of_other(), "stage": pipeline.stage_attr}
        self._write_values(name, tensor, attrs)

    def _write_values(self, name, tensor, attrs):
        """A tap's values to the writer, its layout checked and counted (an
        `order` in attrs stands: a pipeline's, pipeline.py)."""
        if not self.reference_mode and "order" not in attrs:
            # execution order, whichever write comes first (sketches wait for the step's end)
            attrs = {**attrs, "order": self._order}
            self._order += 1
        complex_parts = getattr(tensor, "_diffcheck_complex", False)  # capture_hooks.complex_view
        if complex_parts:  # its last dimension is not a feature dimension: written whole, marked
            attrs = {**attrs, "complex": 1}
        elif self.sketches is not None and self.sketches.offer(name, tensor, attrs, logical_dtype(tensor)):
            return

        def prepare():
            """Here, before the model goes on: this rank's values, copied if
            they are the tensor's own memory (the model may change it in place,
            as an all-reduce does). A device tensor (or any, in the CPU twin)
            with host staging: an asynchronous copy the writer waits for."""
            staging = self._host_staging
            if staging is not None and (tensor.device.type != "cpu" or staging.pinned is False):
                host, done, buf = staging.copy(tensor)

                def job():
                    try:
                        done.synchronize()
                        array, logical = to_numpy(host)
                        self._store(name, array, logical, attrs)
                    finally:
                        staging.release(buf)
                return job
            array, logical = to_numpy(tensor)
            if tensor.device.type == "cpu" and array.size and array.ctypes.data == tensor.data_ptr():
                array = self._staged(array) if staging is None else array.copy()
            return lambda: self._store(name, array, logical, attrs)
        self._thread.submit(prepare)

    def _with_counts(self, name, tensor, attrs):
        """`attrs` plus the tensor's rounding counts (rounding.py; a compiled
        model's from its fake forward, compiled_counts.py), unless the user
        gave a depth: a partial sum's depth is the global one."""
        depth, steps, own = self._counts.of(name[len(self._step):], tensor)
        if "reduction_depth" in attrs or not (depth or steps):
            return attrs
        partial = attrs.get("partial")
        if partial:
            ranks = 1
            for axis in partial.split("*"):
                ranks *= self.axis_sizes.get(axis, 1)
            depth += own * (ranks - 1)
        return {**attrs, "reduction_depth": max(int(depth), 1), "rounding_steps": max(math.ceil(steps), 1)}

    def _staged(self, array):
        """A copy of `array` in the capture's one staging buffer: the writer
        thread writes one tap at a time, so one buffer, reused, serves every
        tap (fresh memory per tap costs its page faults every time)."""
        if self._staging is None or self._staging.nbytes < array.nbytes:
            self._staging = None
            self._staging = np.empty(array.nbytes, np.uint8)
        copy = self._staging[:array.nbytes].view(array.dtype).reshape(array.shape)
        np.copyto(copy, array)
        return copy

    def _store(self, name, array, logical, attrs):
        """On the writer thread."""
        if self.reference_mode:
            self._guarded(name, lambda: self._writer.reference(name, array))
        else:
            attrs = dict(attrs)
            more = {k: attrs.pop(k) for k in ("complex", "stage", "microbatches", "microbatch_copies_differ")
                    if k in attrs} or None
            self._guarded(name, lambda: self._writer.write_tap(name, array, dtype=logical, more=more, **attrs))

    def _guarded(self, name, store):
        """A write on the writer thread; an h5py error names the rank, tap and file."""
        try:
            store()
        except ValueError:
            raise
        except Exception as e:
            raise OSError(f"rank {self.rank}: writing tap '{name}' to {self._writer.path}.tmp failed: {e}") from e
