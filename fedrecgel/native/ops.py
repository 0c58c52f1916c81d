"""Building, loading and calling the kernels of ``sam_kernels.cpp`` (see the package)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.native import NativeUnavailable, mode
from fedrecgel.passes import Layout, make_layout

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("sam_kernels.cpp")
NAME = "fedrecgel_native"
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def _cpu_key() -> str:
    """What -march=native compiles for: the machine type and the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def build_dir() -> Path:
    """The folder of this source's build for this torch, Python and CPU."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode()):
        h.update(part)
    h.update(" ".join(CFLAGS).encode())
    h.update(_cpu_key().encode())
    env = os.environ.get("FEDREC_NATIVE_DIR", "").strip()
    root = Path(env).expanduser() if env else Path.home() / ".cache/fedrecgel/native"
    return root / h.hexdigest()[:16]


def _library(d: Path) -> Path:
    return d / f"{NAME}.so"


def _built(d: Path) -> Path:
    """Written once a build has finished and loaded: a library without it (a build killed while
    linking) is built again rather than loaded."""
    return d / "built"


def _failed(d: Path) -> Path:
    """Left in the build folder by a build that failed: ``auto`` does not try again there."""
    return d / "build-failed"


def build() -> Path:
    """Compile the kernels into :func:`build_dir` (if not there yet) and return the library."""
    d = build_dir()
    lib = _library(d)
    if _built(d).exists():
        return lib
    from torch.utils.cpp_extension import load  # slow to import: only when building

    d.mkdir(parents=True, exist_ok=True)
    log.info("building the native client-step kernels into %s (once)", d)
    try:
        load(
            NAME,
            sources=[str(SOURCE)],
            build_directory=str(d),
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:
        _failed(d).write_text(f"{e}\n")
        raise
    _failed(d).unlink(missing_ok=True)
    _built(d).write_text(f"{lib}\n")
    return lib


_off = threading.local()


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Within this block (on this thread) :func:`kernels` is None: the torch code runs (the
    benchmarks time both paths side by side)."""
    before = getattr(_off, "on", False)
    _off.on = True
    try:
        yield
    finally:
        _off.on = before


def kernels() -> Any | None:
    """``torch.ops.fedrecgel`` with the kernels loaded, or None where they are not in use."""
    if getattr(_off, "on", False):
        return None
    return _load()


@functools.cache
def _load() -> Any | None:
    m = mode()
    if m == "0":
        return None
    if hasattr(torch.ops.fedrecgel, "ncf_group_step"):
        return torch.ops.fedrecgel
    try:
        d = build_dir()
        lib = _library(d)
        if not _built(d).exists():
            if m == "auto" and not (shutil.which("c++") and shutil.which("ninja")):
                log.info("no C++ compiler or ninja here: the client step runs on torch ops")
                return None
            if m == "auto" and _failed(d).exists():
                log.info("the native kernels failed to build before (%s): torch ops", _failed(d))
                return None
            lib = build()
        torch.ops.load_library(str(lib))  # type: ignore[no-untyped-call]  # torch: unannotated
    except Exception as e:
        if m == "1":
            raise NativeUnavailable(f"the native kernels could not be built or loaded: {e}") from e
        log.warning("native kernels unavailable, the client step runs on torch ops: %s", e)
        return None
    return torch.ops.fedrecgel


def main() -> None:
    """``python -m fedrecgel.native``: build the kernels now and say where they are."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        lib = build()
        torch.ops.load_library(str(lib))  # type: ignore[no-untyped-call]  # torch: unannotated
    except Exception as e:
        print(f"error: the native kernels could not be built: {e}", file=sys.stderr)
        raise SystemExit(1) from e
    print(lib)


def group_step(
    ops: Any,
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    priv: dict[str, Tensor],
    samples: list[tuple[np.ndarray, np.ndarray]],
    rho: tuple[float, float],
    chunk_size: int,
    weights: Tensor,
    tables: dict[str, Tensor],
) -> tuple[Layout, dict[str, Tensor], dict[str, Tensor], Tensor]:
    """:func:`fedrecgel.sam._group_step` for the aggregate path of NCF with rho_sh > 0, on the
    kernels ``ops``, with ``rho`` (rho_sh, rho_ns) and the loss's ``chunk_size``: the same
    results (the layout, ``sum_c weights_c upload_c`` with the item rows added into ``tables``,
    the private SAM gradients, the pass-1 losses)."""
    lay = make_layout(samples, cfg.n_items, chunk_size)
    n, c = len(lay.items), lay.n_clients
    layers = range(cfg.layers)
    w = [shared[f"tower.{k}.weight"].contiguous() for k in layers]
    b = [shared[f"tower.{k}.bias"].contiguous() for k in layers]
    acc_w = [torch.zeros_like(t) for t in w]
    acc_b = [torch.zeros_like(t) for t in b]
    wp = shared["predict.weight"].reshape(-1).contiguous()
    acc_wp, acc_bp = torch.zeros_like(wp), torch.zeros(1)
    ug, um = priv["user_gmf"].contiguous(), priv["user_mlp"].contiguous()
    row_gmf, row_mlp = torch.empty(n, cfg.factor), torch.empty(n, cfg.mlp_dim)
    g_ug, g_um, loss = torch.empty_like(ug), torch.empty_like(um), torch.empty(c)
    ops.ncf_group_step(
        torch.from_numpy(lay.offsets),
        torch.from_numpy(np.ascontiguousarray(lay.pair_offsets, dtype=np.int64)),
        lay.sample_pair,
        lay.pair_items,
        lay.items,
        lay.labels,
        lay.weights,
        weights.contiguous(),
        ug,
        um,
        w,
        b,
        wp,
        shared["predict.bias"].contiguous(),
        shared["item_gmf"].contiguous(),
        shared["item_mlp"].contiguous(),
        float(rho[0]),
        float(rho[1]),
        acc_w,
        acc_b,
        acc_wp,
        acc_bp,
        row_gmf,
        row_mlp,
        g_ug,
        g_um,
        loss,
    )
    tables["item_gmf"].index_add_(0, lay.items, row_gmf)
    tables["item_mlp"].index_add_(0, lay.items, row_mlp)
    up: dict[str, Tensor] = dict(tables)
    for k in layers:
        up[f"tower.{k}.weight"], up[f"tower.{k}.bias"] = acc_w[k], acc_b[k]
    up["predict.weight"], up["predict.bias"] = acc_wp.reshape(1, -1), acc_bp
    return lay, up, {"user_gmf": g_ug, "user_mlp": g_um}, loss
