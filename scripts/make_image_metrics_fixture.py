#!/usr/bin/env python3
"""Make tests/fixtures/image_metrics_small.h5: image pairs and their PSNR and
SSIM as scikit-image computes them (peak_signal_noise_ratio,
structural_similarity with channel_axis=-1 and an explicit data_range), for
tests/test_image_metrics.cpp. Needs Debian's python3-skimage:

    /usr/bin/python3 scripts/make_image_metrics_fixture.py tests/fixtures/image_metrics_small.h5
"""
import sys

import h5py
import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

rng = np.random.default_rng(0)
cases = {}
# A smooth image and three distortions of it: noise, a shifted seam, a blur.
y, x = np.mgrid[0:16, 0:32]
base = np.stack([0.5 + 0.4 * np.sin(x / 5.0), 0.5 + 0.4 * np.cos(y / 4.0), (x + y) / 48.0], axis=-1)
cases["noise"] = (base, np.clip(base + rng.normal(0, 0.05, base.shape), 0, 1), 1.0)
seam = base.copy()
seam[:, 16:] = np.roll(base[:, 16:], 1, axis=0)
cases["seam"] = (base, seam, 1.0)
blur = (base + np.roll(base, 1, axis=1) + np.roll(base, -1, axis=1)) / 3
cases["blur"] = (base, blur, 1.0)
cases["range255"] = (base * 255, np.clip(base * 255 + rng.normal(0, 20, base.shape), 0, 255), 255.0)

with h5py.File(sys.argv[1], "w", track_order=True) as f:
    f.attrs.update({"diffcheck_schema": 1, "mesh": "x=1", "world_size": 1,
                    "producer": "scripts/make_image_metrics_fixture.py (scikit-image)"})
    for name, (ref, img, rng_) in cases.items():
        f.create_dataset(f"taps/{name}/reference", data=ref[None].astype(np.float64))
        f.create_dataset(f"taps/{name}/image", data=img[None].astype(np.float64))
        metrics = np.array([rng_, peak_signal_noise_ratio(ref, img, data_range=rng_),
                            structural_similarity(ref, img, data_range=rng_, channel_axis=-1)])
        f.create_dataset(f"taps/{name}/metrics", data=metrics[None])
