"""Server side: aggregation of client SAM gradients and the server optimizer.

Shaped after Flower's strategies: the maths are plain functions on tensors
(:func:`aggregate_gradients`), a :class:`Strategy` turns a round's uploads into new shared
parameters, and add-ons (:class:`ClipUpdates`) wrap another strategy. The strategy knows no
HTTP and no storage; its whole state is a ``dict[str, Tensor]`` so it can be persisted as
safetensors with every model version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from fedrecgel.config import DEFAULTS, LrDecay
from fedrecgel.config import OptimizerName as OptimizerName  # re-exported
from fedrecgel.config import ServerUpdate as ServerUpdate  # re-exported
from fedrecgel.config import Weighting as Weighting  # re-exported
from fedrecgel.model import ITEM_TABLES
from fedrecgel.uploads import PartialSum, Update


def aggregate_gradients(
    updates: Sequence[Update],
    shapes: dict[str, tuple[int, ...]],
    weighting: Weighting = DEFAULTS.weighting,
) -> dict[str, Tensor]:
    """Weighted mean of the clients' gradients, densified: name -> tensor of ``shapes[name]``.

    ``mean`` is the faithful (1/m) sum over the m clients that reported; ``samples`` weights
    each client by its sample count. Updates are summed in client-id order, never in arrival
    order, so the result does not depend on timing.
    """
    if not updates:
        raise ValueError("cannot aggregate an empty round")
    ordered = sorted(updates, key=lambda u: u.client_id)
    weights = mean_weights(np.array([u.n_samples for u in ordered]), weighting).tolist()
    out = {name: torch.zeros(shape) for name, shape in shapes.items()}
    for u, w in zip(ordered, weights, strict=True):
        for name, (idx, vals) in u.rows.items():
            out[name].index_add_(0, idx, vals, alpha=w)
        for name, g in u.dense.items():
            out[name].add_(g, alpha=w)
    return out


def mean_weights(n_samples: np.ndarray, weighting: Weighting) -> np.ndarray:
    """Each client's weight in the mean: 1/m, or its share of the round's samples (float64)."""
    n = np.asarray(n_samples, dtype=np.float64)
    if weighting == "mean":
        return np.full(len(n), 1.0 / len(n))
    return n / float(n.sum())


def partial_weights(n_samples: np.ndarray, weighting: Weighting) -> np.ndarray:
    """Each client's weight inside a worker's partial sum: 1 (``mean``) or its sample count
    (``samples``); :func:`combine_partials` divides by the round's total weight."""
    n = np.asarray(n_samples, dtype=np.float64)
    return np.ones(len(n)) if weighting == "mean" else n


def combine_partials(
    partials: Sequence[PartialSum],
    shapes: dict[str, tuple[int, ...]],
    weighting: Weighting = DEFAULTS.weighting,
) -> dict[str, Tensor]:
    """The round's weighted mean from the workers' partial sums (``upload_grouping=worker``).

    The partial sums are added in the order of their first client id (never arrival order),
    then divided by the total weight (clients for ``mean``, samples for ``samples``): the
    aggregator and the simulator both call this, so a run over HTTP equals the simulator
    bit for bit.
    """
    if not partials:
        raise ValueError("cannot aggregate an empty round")
    ordered = sorted(partials, key=lambda p: p.client_ids[0])
    out = {name: torch.zeros(shape) for name, shape in shapes.items()}
    for p in ordered:
        for name, (idx, vals) in p.rows.items():
            out[name].index_add_(0, idx, vals)
        for name, g in p.dense.items():
            out[name].add_(g)
    if weighting == "mean":
        total = float(sum(len(p.client_ids) for p in ordered))
    else:
        total = float(sum(sum(p.n_samples) for p in ordered))
    for t in out.values():
        t.div_(total)
    return out


def partial_loss(partials: Sequence[PartialSum]) -> float:
    """The round's mean client loss from the workers' partial sums (in first-client order)."""
    ordered = sorted(partials, key=lambda p: p.client_ids[0])
    n = sum(len(p.client_ids) for p in ordered)
    return float(sum(p.loss for p in ordered) / n) if n else float("nan")


@dataclass(frozen=True)
class ServerOptConfig:
    """Server optimizer: name, learning rate and its constants.

    ``adam`` is torch's Adam (the faithful default, lr 0.001). ``fedadam`` / ``fedyogi`` /
    ``fedadagrad`` are the adaptive server optimizers of Reddi et al. (2021) with their
    tau (eps) of 1e-3 and beta2 0.99; ``sgd`` is plain (momentum optional).
    """

    name: OptimizerName = "adam"
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    momentum: float = 0.0
    #: steps over which the step size ramps up linearly (step t takes lr * t / warmup)
    warmup: int = 0
    #: after the warm-up: ``constant``, or ``cosine`` decay to 0 at step ``total``
    decay: LrDecay = "constant"
    total: int = 1
    #: decoupled weight decay (AdamW's rule, for every optimizer): before each step the
    #: score network's weight matrices (not its biases, not the item tables: a row moves only
    #: when a client touched it, and a rare item's row would fade between its touches) shrink
    #: by ``lr * weight_decay``
    weight_decay: float = 0.0
    #: ``dense``: every row of the item tables each step (the paper); ``lazy`` (adam only):
    #: only the rows the step touched, see :meth:`ServerOptimizer.step`
    update: ServerUpdate = "dense"

    def __post_init__(self) -> None:
        if self.update == "lazy" and self.name != "adam":
            raise ValueError(f"a lazy server update is only defined for adam, not {self.name}")

    @staticmethod
    def preset(name: OptimizerName, lr: float) -> ServerOptConfig:
        """The usual constants of each optimizer."""
        if name in ("fedadam", "fedyogi", "fedadagrad"):
            return ServerOptConfig(name=name, lr=lr, beta1=0.9, beta2=0.99, eps=1e-3)
        return ServerOptConfig(name=name, lr=lr)

    def lr_at(self, t: int) -> float:
        """The step size of step ``t`` (1-based): ``lr`` unless a schedule is set."""
        lr = self.lr
        if self.warmup and t <= self.warmup:
            return lr * t / self.warmup
        if self.decay == "cosine":
            span = max(self.total - self.warmup, 1)
            done = min(max(t - self.warmup, 0), span) / span
            lr *= 0.5 * (1.0 + math.cos(math.pi * done))
        return lr


class ServerOptimizer:
    """Applies an aggregated gradient to the shared parameters; state is name -> Tensor.

    With ``update="lazy"`` (adam only) the item tables are stepped row-sparsely; the state then
    also holds ``<table>.last_step``: per row, the step count its moments are current at.
    """

    def __init__(self, cfg: ServerOptConfig) -> None:
        self.cfg = cfg
        self.state: dict[str, Tensor] = {"step": torch.zeros((), dtype=torch.int64)}

    def step(
        self,
        params: dict[str, Tensor],
        grads: dict[str, Tensor],
        rows: dict[str, Tensor] | None = None,
    ) -> None:
        """Update ``params`` in place with ``grads``.

        ``update="lazy"``: an item table's step touches only its rows in ``rows[table]`` (any
        int64 index set holding at least every row whose gradient is not all zero, e.g. the
        items of the round's samples), or when ``rows`` does not name the table, the rows with
        a nonzero gradient entry (a scan of the dense gradient). A touched row untouched for
        the ``k`` steps since its moments were last current first has them decayed by
        ``beta1**k`` and ``beta2**k``, then takes the dense step's formula with the global step
        count's bias correction and step size. So, with a zero gradient on every other row:

        * the moments of a touched row, and its increment this step, equal the dense step's
          (up to float rounding: one multiplication by ``beta**k`` against ``k`` dense decays;
          bit for bit when every row is touched every step, ``k = 0``);
        * an untouched row does not move, where dense Adam still moves it by
          ``-lr_s / bc1_s * m_s / (sqrt(v_s) / sqrt(bc2_s) + eps)`` at each step ``s`` of the
          gap, with its decaying but nonzero old momentum ``m_s``: a row's value differs
          from the dense run's by the sum of those momentum-only moves (the difference is
          in the parameters, not in the moments).

        Weight decay is unaffected: it only shrinks the score network's weight matrices,
        which are stepped densely either way.
        """
        self.state["step"] += 1
        t = int(self.state["step"])
        c = self.cfg
        if c.warmup or c.decay != "constant":
            c = replace(c, lr=c.lr_at(t))
        with torch.no_grad():
            for name, g in grads.items():
                p = params[name]
                if c.weight_decay and p.dim() >= 2 and name not in ITEM_TABLES:
                    p.mul_(1 - c.lr * c.weight_decay)
                if c.name == "sgd":
                    if c.momentum:
                        buf = self._slot(name, "momentum", p)
                        buf.mul_(c.momentum).add_(g)
                        g = buf
                    p.sub_(g, alpha=c.lr)
                    continue
                if c.update == "lazy" and name in ITEM_TABLES:
                    touched = (rows or {}).get(name)
                    self._lazy_adam(name, p, g, t, c, touched)
                    continue
                m = self._slot(name, "exp_avg", p)
                v = self._slot(name, "exp_avg_sq", p)
                if c.name == "adam":
                    # torch.optim.Adam, bit for bit in its formula
                    m.lerp_(g, 1 - c.beta1)
                    v.mul_(c.beta2).addcmul_(g, g, value=1 - c.beta2)
                    bc1 = 1 - c.beta1**t
                    bc2_sqrt = math.sqrt(1 - c.beta2**t)
                    denom = (v.sqrt() / bc2_sqrt).add_(c.eps)
                    p.addcdiv_(m, denom, value=-c.lr / bc1)
                    continue
                m.mul_(c.beta1).add_(g, alpha=1 - c.beta1)
                g2 = g * g
                if c.name == "fedadam":
                    v.mul_(c.beta2).add_(g2, alpha=1 - c.beta2)
                elif c.name == "fedyogi":
                    v.sub_((1 - c.beta2) * g2 * torch.sign(v - g2))
                else:  # fedadagrad
                    v.add_(g2)
                p.sub_(c.lr * m / (v.sqrt() + c.eps))

    def _lazy_adam(
        self,
        name: str,
        p: Tensor,
        g: Tensor,
        t: int,
        c: ServerOptConfig,
        touched: Tensor | None,
    ) -> None:
        """Adam on the rows of ``p`` in ``touched`` (default: ``g``'s nonzero rows), their
        moments first brought forward over the steps they missed (see :meth:`step`)."""
        m = self._slot(name, "exp_avg", p)
        v = self._slot(name, "exp_avg_sq", p)
        key = f"{name}.last_step"
        if key not in self.state:  # fresh moments (zero) or a dense run's: current as of t - 1
            self.state[key] = torch.full((p.shape[0],), t - 1, dtype=torch.int64)
        last = self.state[key]
        idx = nonzero_rows(g) if touched is None else touched.to(torch.int64)
        if not len(idx):
            return
        missed = (t - 1 - last.index_select(0, idx)).to(torch.float64)
        gr, mr, vr = g.index_select(0, idx), m.index_select(0, idx), v.index_select(0, idx)
        if bool(missed.any()):  # x * 1.0 == x: rows current at t - 1 are left bit for bit
            shape = (-1,) + (1,) * (p.dim() - 1)
            mr.mul_(torch.pow(c.beta1, missed).to(mr.dtype).view(shape))
            vr.mul_(torch.pow(c.beta2, missed).to(vr.dtype).view(shape))
        # the dense adam's formula, on the touched rows
        mr.lerp_(gr, 1 - c.beta1)
        vr.mul_(c.beta2).addcmul_(gr, gr, value=1 - c.beta2)
        bc1 = 1 - c.beta1**t
        bc2_sqrt = math.sqrt(1 - c.beta2**t)
        denom = (vr.sqrt() / bc2_sqrt).add_(c.eps)
        pr = p.index_select(0, idx).addcdiv_(mr, denom, value=-c.lr / bc1)
        p.index_copy_(0, idx, pr)
        m.index_copy_(0, idx, mr)
        v.index_copy_(0, idx, vr)
        last.index_fill_(0, idx, t)

    def _slot(self, name: str, kind: str, like: Tensor) -> Tensor:
        key = f"{name}.{kind}"
        if key not in self.state:
            init = self.cfg.eps**2 if kind == "exp_avg_sq" and self.cfg.name == "fedyogi" else 0.0
            self.state[key] = torch.full_like(like, init)
        return self.state[key]

    def state_dict(self) -> dict[str, Tensor]:
        """All optimizer state as tensors (for persistence)."""
        return {k: v.clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self.state = {k: v.clone() for k, v in state.items()}


def nonzero_rows(g: Tensor) -> Tensor:
    """The indices (int64, ascending) of the rows of ``g`` with a nonzero entry."""
    flat = g.reshape(g.shape[0], -1)
    return ((flat.amax(dim=1) != 0) | (flat.amin(dim=1) != 0)).nonzero().squeeze(1)


def touched_rows(
    indices: Sequence[np.ndarray | Tensor], tables: Sequence[str] = ITEM_TABLES
) -> dict[str, Tensor]:
    """The union of ``indices`` (item ids), ascending, for each of ``tables``: the ``rows``
    of a lazy server step (:meth:`ServerOptimizer.step`)."""
    parts = [torch.as_tensor(np.asarray(i, dtype=np.int64).ravel()) for i in indices]
    union = torch.unique(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.int64)
    return {name: union for name in tables}


def partial_rows(partials: Sequence[PartialSum]) -> dict[str, Tensor]:
    """Per item table, the rows any of ``partials`` carries: the ``rows`` of a lazy server
    step over :func:`combine_partials` of them."""
    names = sorted({name for p in partials for name in p.rows})
    return {
        name: touched_rows([p.rows[name][0] for p in partials if name in p.rows], (name,))[name]
        for name in names
    }


class Strategy:
    """Turns one round's uploads into the next shared parameters."""

    def aggregate(
        self,
        updates: Sequence[Update],
        shapes: dict[str, tuple[int, ...]],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """The server's gradient for this round (``cohort_size``: the round's public cohort
        size, which a differentially private strategy divides by)."""
        raise NotImplementedError

    def apply(
        self,
        params: dict[str, Tensor],
        grads: dict[str, Tensor],
        rows: dict[str, Tensor] | None = None,
    ) -> None:
        """Update ``params`` in place (``rows``: per item table, a superset of the rows with a
        nonzero gradient, which a lazy server step may use instead of scanning ``grads``)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Tensor]:
        """Server-side state to persist with a model version."""
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def linear_weights(self, n_samples: np.ndarray) -> np.ndarray | None:
        """The weights ``a_c`` when :meth:`aggregate` of a round's uploads is exactly the
        linear combination ``sum_c a_c upload_c`` (``n_samples``: each client's sample count,
        in cohort order); None otherwise. The simulator then sums the clients' gradients
        inside the batched backward instead of building every upload."""
        return None

    def round(
        self,
        params: dict[str, Tensor],
        updates: Sequence[Update],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """Aggregate and apply; returns the aggregated gradient."""
        grads = self.aggregate(updates, {k: tuple(v.shape) for k, v in params.items()}, cohort_size)
        self.apply(params, grads)
        return grads


class FedAvgGradients(Strategy):
    """Mean of the clients' SAM gradients, then one server-optimizer step (FedRecGEL's server)."""

    def __init__(
        self, opt: ServerOptConfig | None = None, weighting: Weighting = DEFAULTS.weighting
    ) -> None:
        self.weighting: Weighting = weighting
        self.optimizer = ServerOptimizer(opt or ServerOptConfig())

    def aggregate(
        self,
        updates: Sequence[Update],
        shapes: dict[str, tuple[int, ...]],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """Weighted mean of the uploads."""
        return aggregate_gradients(updates, shapes, self.weighting)

    def linear_weights(self, n_samples: np.ndarray) -> np.ndarray | None:
        """The mean's weights (None in a subclass that aggregates otherwise)."""
        if type(self).aggregate is not FedAvgGradients.aggregate:
            return None
        return mean_weights(n_samples, self.weighting)

    def apply(
        self,
        params: dict[str, Tensor],
        grads: dict[str, Tensor],
        rows: dict[str, Tensor] | None = None,
    ) -> None:
        """One optimizer step."""
        self.optimizer.step(params, grads, rows)

    def state_dict(self) -> dict[str, Tensor]:
        """The optimizer state."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore the optimizer state."""
        self.optimizer.load_state_dict(state)


def update_norm(u: Update | PartialSum) -> float:
    """The L2 norm of an upload's whole shared part (rows and dense parameters), in float64."""
    sq = sum(float(v.double().pow(2).sum()) for _, v in u.rows.values())
    sq += sum(float(g.double().pow(2).sum()) for g in u.dense.values())
    return math.sqrt(sq)


def scaled(u: Update, factor: float) -> Update:
    """``u`` with every value multiplied by ``factor``."""
    return Update(
        client_id=u.client_id,
        n_samples=u.n_samples,
        rows={k: (i, v * factor) for k, (i, v) in u.rows.items()},
        dense={k: g * factor for k, g in u.dense.items()},
        loss=u.loss,
    )


def clip_update(u: Update, clip: float, norm: float | None = None) -> Update:
    """``u`` scaled to L2 norm at most ``clip`` over rows and score network together
    (unchanged when already within); ``norm``: its :func:`update_norm`, when known."""
    norm = update_norm(u) if norm is None else norm
    if norm <= clip:
        return u
    # a hair under C so that float32 rounding of the product stays within C
    return scaled(u, clip / norm * (1.0 - 1e-6))


class Wrapped(Strategy):
    """A strategy around an ``inner`` one: aggregates its own way, steps with the inner
    strategy's optimizer (and keeps its state)."""

    inner: Strategy

    def apply(
        self,
        params: dict[str, Tensor],
        grads: dict[str, Tensor],
        rows: dict[str, Tensor] | None = None,
    ) -> None:
        """Delegate to the inner strategy."""
        self.inner.apply(params, grads, rows)

    def state_dict(self) -> dict[str, Tensor]:
        """The inner strategy's state."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore the inner strategy's state."""
        self.inner.load_state_dict(state)


class ClipUpdates(Wrapped):
    """Wraps a strategy; first scales every update to L2 norm at most ``max_norm``."""

    def __init__(self, inner: Strategy, max_norm: float) -> None:
        if max_norm <= 0:
            raise ValueError("max_norm must be positive")
        self.inner = inner
        self.max_norm = max_norm

    def aggregate(
        self,
        updates: Sequence[Update],
        shapes: dict[str, tuple[int, ...]],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """Clip each update, then aggregate with the inner strategy."""
        return self.inner.aggregate(
            [clip_update(u, self.max_norm) for u in updates], shapes, cohort_size
        )


def make_strategy(
    optimizer: OptimizerName = DEFAULTS.optimizer,
    lr: float = DEFAULTS.server_lr,
    weighting: Weighting = DEFAULTS.weighting,
    clip: float | None = DEFAULTS.clip,
) -> Strategy:
    """Build the server strategy from plain options (the optimizer's usual constants)."""
    return fedavg_of(ServerOptConfig.preset(optimizer, lr), weighting, clip)


def fedavg_of(opt: ServerOptConfig, weighting: Weighting, clip: float | None) -> Strategy:
    """FedAvg over the gradients with ``opt``, wrapped in clipping when ``clip`` is set."""
    s: Strategy = FedAvgGradients(opt, weighting)
    if clip is not None:
        s = ClipUpdates(s, clip)
    return s
