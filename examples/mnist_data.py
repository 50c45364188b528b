"""MNIST for the TensorFlow examples, with nothing downloaded: the Keras cache
(~/.keras/datasets/mnist.npz) or the idx files in a directory when present,
else a synthetic, learnable stand-in of the same shapes (noisy, shifted
copies of ten fixed class templates). numpy only."""

import gzip
import os
import struct

import numpy as np

__all__ = ["load"]


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        ndim = magic & 0xFF
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def _find(data_dir, stem):
    for d in (data_dir, os.path.join(data_dir, "MNIST", "raw")):
        for suffix in ("", ".gz"):
            p = os.path.join(d, stem + suffix)
            if os.path.exists(p):
                return p
    return None


def _synthetic(n, seed):
    g = np.random.default_rng(1234)
    templates = (g.random((10, 28, 28)) > 0.8).astype(np.float32)
    # a 3x3 box blur thickens the strokes
    padded = np.pad(templates, ((0, 0), (1, 1), (1, 1)))
    templates = sum(padded[:, i : i + 28, j : j + 28] for i in range(3) for j in range(3)) / 9 * 2
    g = np.random.default_rng(seed)
    y = g.integers(0, 10, n)
    x = templates[y]
    shifts = g.integers(-2, 3, (n, 2))
    x = np.stack([np.roll(x[i], (shifts[i, 0], shifts[i, 1]), (0, 1)) for i in range(n)])
    x = x + 0.6 * g.standard_normal(x.shape)
    x = (x - x.min()) / (x.max() - x.min())
    return (x * 255).astype(np.uint8), y.astype(np.uint8)


def load(data_dir=None, synthetic_size=30000, seed=0):
    """Returns ((x_train, y_train), (x_test, y_test), source) with uint8 images
    of shape (N, 28, 28) and uint8 labels, like keras.datasets.mnist."""
    cache = os.path.expanduser("~/.keras/datasets/mnist.npz")
    if os.path.exists(cache):
        with np.load(cache) as f:
            return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"]), cache
    if data_dir:
        parts = [_find(data_dir, s) for s in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")]
        parts += [_find(data_dir, s) for s in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
        if all(parts):
            xs = [_read_idx(p) for p in parts]
            return (xs[0], xs[1]), (xs[2], xs[3]), data_dir
    train = _synthetic(synthetic_size, seed)
    test = _synthetic(max(1, synthetic_size // 4), seed + 1)
    return train, test, "synthetic stand-in (no MNIST files found; nothing is downloaded)"
