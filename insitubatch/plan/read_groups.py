"""Model-parallel read groups: the ranks of one model replica read the same samples, each its part of the grid.

A model too large for one device splits each sample's grid between ``G``
ranks (anemoi-training's ``read_group_size``). Those ranks form a *read
group*: consecutive ranks, ``rank // G`` numbering the group (the model
replica) and ``rank % G`` the member within it. Every member of a group is
dealt the same samples in the same order, because the epoch is dealt to
the ``world_size // G`` replicas, never to the ranks (``plan.distributed``
cuts it among replicas exactly as it cuts it among ranks without groups:
chunk-disjoint, balanced, under every ``last_batch`` policy, resumable at
another world size). What differs between members is their *part* of each
sample, a selection applied to every variable:

* a dimension name: the member's band along it. Bands are cut at the
  stored tiles' edges, so each tile is read by one member and a replica
  reads every tile once; each cut is the tile edge nearest the member's
  even share of rows (``numpy.array_split``'s: the first ``n % G``
  members take one row more), kept so that every member has at least one
  tile. Where the dimension has fewer tiles than the group has members
  (a field stored in one chunk along it), bands are the even shares
  themselves and a tile spanning several bands is read by each of them.
  181 latitudes over 4 members are 46, 45, 45 and 45 rows in tiles of one
  row, and 46, 46, 46 and 43 in tiles of 46.
* ``G`` explicit ``isel`` mappings, one per member, applied as given.

A variable or static without the part's dimensions is read whole by every
member (a 1-D series, say); statics take the same band as the variables
(they are read once per dataset, so their tiles do not matter).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ..io.geometry import ArrayGeometry
from ..io.labelled import Labelled
from ..validation import positive_int

__all__ = ["ReadGroup", "band_cuts", "read_group"]

L = TypeVar("L", bound=Labelled)


def _group_of(size: Any, rank: int, world_size: int) -> tuple[int, int]:
    """``(G, first rank of this rank's group)`` from an int or a torch process group."""
    if size is None:
        return 1, rank
    if hasattr(size, "size") and not isinstance(size, (int, np.integer)):  # a torch.distributed ProcessGroup
        import torch.distributed as dist

        ranks = sorted(int(r) for r in dist.get_process_group_ranks(size))
        g = len(ranks)
        if rank not in ranks or ranks != list(range(ranks[0], ranks[0] + g)) or ranks[0] % g:
            raise ValueError(
                f"read_group_size: a process group must hold {g} consecutive ranks starting at a multiple of {g} "
                f"and include this rank {rank}; it holds ranks {ranks}"
            )
        return g, ranks[0]
    g = positive_int("read_group_size", size)
    return g, rank - rank % g


@dataclasses.dataclass(frozen=True)
class ReadGroup:
    """This rank's read group: its replica among ``replicas`` and its member among ``size``, and its part.

    ``part`` is what this member selects of each sample: a dimension name
    (its band is computed by ``bands``) or an ``isel`` mapping; ``None`` when
    the group has one member and nothing was asked.
    """

    size: int
    member: int
    replica: int
    replicas: int
    part: str | Mapping[Any, Any] | None = None

    def bands(self, variables: Mapping[str, ArrayGeometry]) -> dict[str, slice]:
        """This member's ``isel`` of the variables: its band along ``part``'s dimension, or the mapping given."""
        if self.part is None or (self.size == 1 and isinstance(self.part, str)):
            return {}  # one member's band is everything: no selection, so its reads and cache keys stay the plain ones
        if not isinstance(self.part, str):
            known = {d for g in variables.values() for d in g.dims or () if d is not None}
            unknown = [d for d in self.part if d not in known]
            if unknown:
                raise KeyError(
                    f"read_group_part[{self.member}] names dimensions {unknown} that no variable has; "
                    f"the variables' dimensions are {sorted(known)}"
                )
            return dict(self.part)
        dim = self.part
        having = {lb: g for lb, g in variables.items() if dim in (g.dims or ())}
        if not having:
            dims = sorted({d for g in variables.values() for d in g.dims or () if d is not None})
            raise KeyError(f"read_group_part={dim!r} is no dimension of the variables; valid dimensions: {dims}")
        lengths = {lb: _positions(g, dim).size for lb, g in having.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"read_group_part={dim!r}: the variables select different lengths along it ({lengths}); "
                "a band must cut every variable alike: select the same extent, or give an isel per member"
            )
        n = next(iter(lengths.values()))
        if n < self.size:
            raise ValueError(
                f"read_group_part={dim!r} has {n} positions, fewer than the read_group_size={self.size} members"
            )
        edges = None
        for g in having.values():  # a cut every variable reads as a tile edge
            mine = set(_tile_edges(g, dim).tolist())
            edges = mine if edges is None else edges & mine
        cuts = band_cuts(n, self.size, np.array(sorted(edges or {0, n}), dtype=np.int64))
        return {dim: slice(int(cuts[self.member]), int(cuts[self.member + 1]))}

    def cut(self, fields: Mapping[str, L], bands: Mapping[Any, Any]) -> dict[str, L]:
        """Each field (a variable's geometry or a static) with ``bands`` applied on the dimensions it has."""
        out = {}
        for label, f in fields.items():
            mine = {d: key for d, key in bands.items() if d in (f.dims or ())}
            if isinstance(self.part, str) and mine and _positions(f, self.part).size < mine[self.part].stop:
                raise ValueError(
                    f"{label!r} ({f.path!r}) keeps {_positions(f, self.part).size} positions along "
                    f"{self.part!r}, fewer than the variables' band {mine[self.part]} needs: select it alike"
                )
            out[label] = f.isel(mine) if mine else f
        return out

    def describe(self, bands: Mapping[Any, Any]) -> dict[str, Any]:
        """JSON-able: the group's numbers and this member's part (slices as ``[start, stop]``)."""
        part = {
            str(d): [k.start, k.stop, *([k.step] if k.step else [])] if isinstance(k, slice) else k
            for d, k in bands.items()
        }
        return {
            "size": self.size,
            "member": self.member,
            "replica": self.replica,
            "replicas": self.replicas,
            "part": part,
        }


def _positions(g: Labelled, dim: str) -> np.ndarray:
    """The physical positions ``g`` keeps along ``dim`` (everything when it selects none)."""
    axis = g.dims.index(dim) if g.dims else -1
    picked = next((a for a in g.selection if a.axis == axis), None)
    if picked is not None and picked.drop:
        raise ValueError(f"read_group_part={dim!r}: array {g.path!r} selects a single {dim}, which cannot be banded")
    return picked.array if picked is not None else np.arange(g.shape[axis])


def _tile_edges(g: ArrayGeometry, dim: str) -> np.ndarray:
    """Positions (in ``g``'s selected order, 0 and the length included) where the stored tile changes."""
    axis = g.dims.index(dim) if g.dims else -1
    tile = np.asarray(_positions(g, dim)) // g.tile_chunks[axis]
    return np.concatenate([[0], np.flatnonzero(np.diff(tile)) + 1, [len(tile)]]).astype(np.int64)


def band_cuts(n: int, members: int, edges: np.ndarray) -> np.ndarray:
    """``members + 1`` boundaries cutting ``n`` positions into bands, at ``edges`` (sorted, with 0 and ``n``).

    The even shares are ``numpy.array_split``'s (the first ``n % members``
    bands one longer). With at least ``members`` runs between edges, each
    cut is the edge nearest its even boundary (the lower on a tie), moved
    only as far as needed to leave every band at least one run; otherwise
    the even boundaries themselves.
    """
    even = np.concatenate([[0], np.cumsum([n // members + (j < n % members) for j in range(members)])])
    runs = len(edges) - 1
    if runs < members:
        return even.astype(np.int64)
    cuts, prev = [0], 0
    for j in range(1, members):
        k = int(np.argmin(np.abs(edges - even[j])))
        k = min(max(k, prev + 1), runs - (members - j))
        cuts.append(int(edges[k]))
        prev = k
    return np.array([*cuts, n], dtype=np.int64)


def read_group(size: Any, part: str | Sequence[Mapping[Any, Any]] | None, rank: int, world_size: int) -> ReadGroup:
    """This rank's ``ReadGroup`` from ``read_group_size`` (an int or a torch process group) and ``read_group_part``.

    Raises
    ------
    ValueError
        ``world_size`` is not a multiple of the group size, a process group
        is not consecutive ranks, a group of several members has no part, or
        the parts are not one ``isel`` mapping per member.
    TypeError
        ``read_group_part`` is neither a dimension name nor a list of mappings.
    """
    g, first = _group_of(size, rank, world_size)
    if world_size % g:
        raise ValueError(
            f"world_size={world_size} is not a multiple of read_group_size={g}: every model replica needs all "
            f"{g} of its ranks (valid world sizes: {g}, {2 * g}, {3 * g}, ...)"
        )
    member = rank - first
    if part is None:
        if g > 1:
            raise ValueError(
                f"read_group_size={g} needs read_group_part: a dimension to cut into {g} bands "
                f"(read_group_part='latitude'), or {g} isel mappings, one per member"
            )
        chosen: str | Mapping[Any, Any] | None = None
    elif isinstance(part, str):
        chosen = part
    elif isinstance(part, Sequence) and all(isinstance(p, Mapping) for p in part):
        if len(part) != g:
            raise ValueError(
                f"read_group_part holds {len(part)} isel mappings; read_group_size={g} needs one per member"
            )
        chosen = part[member]
    else:
        raise TypeError(
            f"read_group_part must be a dimension name or a list of isel mappings, got {type(part).__name__} ({part!r})"
        )
    return ReadGroup(size=g, member=member, replica=first // g, replicas=world_size // g, part=chosen)
