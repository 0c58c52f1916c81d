"""What a round's clients upload: :class:`Update` (one client's SAM gradients) and
:class:`PartialSum` (one worker's weighted sum of its cohort members'), the core types the
client step produces, the wire encodes, the upload modes store and combine and the server
strategies aggregate."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Update:
    """One client's upload: SAM gradients of the shared part, item tables as sparse rows.

    rows:  table name -> (indices (U,) int64 sorted, values (U, d) float32)
    dense: parameter name -> gradient with the parameter's shape
    """

    client_id: int
    n_samples: int
    rows: dict[str, tuple[Tensor, Tensor]]
    dense: dict[str, Tensor]
    loss: float = 0.0

    @property
    def client_ids(self) -> tuple[int, ...]:
        """The clients it covers: its own (as a :class:`PartialSum` lists those it covers)."""
        return (self.client_id,)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sample counts of the clients it covers."""
        return (self.n_samples,)

    def densify(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
        """The full dense gradient (tests and the reference comparison only)."""
        out: dict[str, Tensor] = {}
        for name, shape in shapes.items():
            if name in self.rows:
                idx, vals = self.rows[name]
                t = torch.zeros(shape)
                t.index_add_(0, idx, vals)
                out[name] = t
            else:
                out[name] = self.dense[name].clone()
        return out


@dataclass
class PartialSum:
    """One worker's upload of a round with ``upload_grouping=worker``: the weighted sum
    ``sum_c w_c g_c`` of its cohort members' shared SAM gradients (``w_c`` = 1, or the
    client's sample count with sample weighting; :func:`fedrecgel.strategy.partial_weights`),
    item tables as sparse rows over the items any of them touched.

    client_ids: the clients it covers, ascending; n_samples: theirs, in that order;
    loss: the sum of their training losses.
    """

    client_ids: tuple[int, ...]
    n_samples: tuple[int, ...]
    rows: dict[str, tuple[Tensor, Tensor]]
    dense: dict[str, Tensor]
    loss: float = 0.0

    @property
    def client_id(self) -> int:
        """The first client it covers (the one its stored body is filed under)."""
        return self.client_ids[0]

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sample counts of the clients it covers."""
        return self.n_samples
