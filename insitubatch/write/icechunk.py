"""Slot writes into an icechunk repository as one transaction: forks for the workers, one commit.

The coordinator opens an :class:`IcechunkTransaction` on a branch whose layout
is committed (``create_layout`` on a writable session, then a commit). Each
slot is written through a ``SlotWriter`` on a *fork* of the transaction's
session (:meth:`IcechunkTransaction.fork_store`): its chunks, and the coverage
record of its slot, live in that fork and nowhere else. A fork that comes back
from a finished slot is :meth:`~IcechunkTransaction.merge`\\ d into the
transaction, which refuses one that touches what another merged fork touched;
:meth:`~IcechunkTransaction.commit` makes every merged slot one snapshot.
Until then readers of the branch see the snapshot before it.

A worker that dies, or whose work raises, never hands its fork back: nothing
of it reaches the transaction, so ``plan_slots(tx.store)`` plans its slots
again and they are rewritten from scratch (the chunk objects a dead fork wrote
are garbage no snapshot names; ``Repository.garbage_collect`` removes them).

``run_plan(tx, plan, work, executor)`` does this for any executor;
:meth:`~IcechunkTransaction.hand_off` and :meth:`~IcechunkTransaction.collect`
(``write.icechunk_handoff``) do it for scheduler tasks that share a
directory or bucket instead of a Python process (SLURM arrays, indexed Jobs,
torchrun).
"""

from __future__ import annotations

import functools
import os
import pickle
from typing import TYPE_CHECKING, Any

from ..errors import WriteConflictError
from ..stores.icechunk_stores import import_icechunk, open_repository
from .icechunk_changes import ForkChanges, MergeLedger, rebase_conflicts
from .icechunk_handoff import clear_handoff, handoff_store, read_transaction, saved_forks, write_transaction
from .records import RECORDS_DIR

if TYPE_CHECKING:
    from icechunk import ForkSession, IcechunkStore, Repository, Session, Storage
    from zarr.abc.store import Store

__all__ = ["IcechunkTransaction"]


class IcechunkTransaction:
    """One commit on an icechunk branch, written by many slot writers each in a fork of its own.

    Parameters
    ----------
    repo
        An ``icechunk.Repository``, an ``icechunk.Storage`` or a local
        directory holding the repository.
    branch
        The branch the commit goes to. The transaction starts from its tip
        (:attr:`base`) and holds no change of its own but what it merges.

    Raises
    ------
    ImportError
        icechunk is not installed.
    FileNotFoundError
        No repository there.
    ValueError
        ``branch`` is not a branch of the repository (the message lists them).
    """

    def __init__(self, repo: Repository | Storage | str | os.PathLike[str], branch: str = "main") -> None:
        icechunk = import_icechunk()
        self.repo, self._where = open_repository(icechunk, repo, create=False)
        if not isinstance(branch, str) or branch not in self.repo.list_branches():
            known = sorted(self.repo.list_branches())
            raise ValueError(
                f"branch={branch!r} is not a branch of the icechunk repository at {self._where}; it has {known}"
            )
        self.branch = branch
        self.session: Session = self.repo.writable_session(branch)
        self.base: str = self.session.snapshot_id
        # forks are copies of this one, made before anything is merged (a session with changes cannot fork)
        self._seed = pickle.dumps(self.session.fork())
        self._bases = {self.base}
        self._ledger = MergeLedger()
        self.snapshot: str | None = None
        self._on_commit: list[Any] = []

    # -- the coordinator's view -------------------------------------------------------
    @property
    def store(self) -> IcechunkStore:
        """The transaction's store: the base snapshot plus every merged slot (what ``plan_slots`` reads)."""
        return self.session.store

    @property
    def merged(self) -> tuple[tuple[int, int], ...]:
        """The slot ranges merged so far, sorted."""
        return tuple(self._ledger.slots)

    def fork(self) -> ForkSession:
        """A new fork of the base snapshot for one worker (picklable; write through its ``.store``)."""
        self._check_open("fork")
        fork: ForkSession = pickle.loads(self._seed)
        return fork

    def fork_store(self) -> IcechunkStore:
        """The store of a new fork: what one worker's ``SlotWriter`` writes its slot through."""
        return self.fork().store

    # -- merging and committing ------------------------------------------------------
    def merge(self, *forks: ForkSession | IcechunkStore) -> tuple[tuple[int, int], ...]:
        """Merge finished forks into the transaction, each only if it clashes with nothing merged.

        Parameters
        ----------
        *forks
            Forks (or their stores) from :meth:`fork`, handed back by the
            workers after their slot writers closed cleanly.

        Returns
        -------
        tuple of (start, stop)
            The slots the given forks recorded complete.

        Raises
        ------
        WriteConflictError
            A fork wrote a chunk, a node or a slot that a merged fork wrote
            (each clash named: array, chunks, slot, both forks), or was forked
            from another snapshot than this transaction's. Forks before it in
            the call are merged; it and the ones after it are not.
        """
        self._check_open("merge")
        done: list[tuple[int, int]] = []
        for fork in forks:
            session: Any = getattr(fork, "session", fork)  # a fork's store, or the fork itself
            if type(session).__name__ != "ForkSession":
                raise TypeError(f"merge takes forks from IcechunkTransaction.fork() (or their stores), got {fork!r}")
            changes = ForkChanges.of(session.status())
            if session.snapshot_id not in self._bases:
                raise WriteConflictError(
                    f"{changes.label} was forked from snapshot {session.snapshot_id}, but this transaction on branch "
                    f"{self.branch!r} started from {self.base}: fork it from this transaction (tx.fork()); "
                    "nothing of it was merged"
                )
            self._merge_checked(session, changes)
            done.extend(changes.slots)
        return tuple(done)

    def _merge_checked(self, session: Any, changes: ForkChanges) -> None:
        clashes = self._ledger.conflicts(changes)
        if clashes:
            raise WriteConflictError(
                f"cannot merge {changes.label} into the transaction on branch {self.branch!r}: "
                + "; ".join(clashes)
                + ". Nothing of it was merged (two workers wrote one slot, or work wrote outside its slot writer)",
                clashes,
            )
        icechunk = import_icechunk()
        try:
            self.session.merge(session)
        except icechunk.IcechunkError as exc:  # what icechunk itself refuses (2.x: two forks made one group)
            detail = str(exc).strip().splitlines()[0]
            raise WriteConflictError(
                f"icechunk refused to merge {changes.label} into the transaction on branch {self.branch!r}: "
                f"{detail}. If it names the {RECORDS_DIR} groups, the layout was committed without them: run "
                "create_layout(session.store, spec, group=...) again on a writable session, commit, and start a "
                "new transaction. Nothing of this fork was merged",
                (detail,),
            ) from exc
        self._ledger.add(changes)

    def commit(self, message: str, metadata: dict[str, Any] | None = None) -> str:
        """Commit every merged slot to the branch as one snapshot; returns its id.

        A branch that moved since :attr:`base` is fine when the commits on it
        touched none of the merged chunks and nodes (icechunk rebases onto them).

        Raises
        ------
        WriteConflictError
            Another commit on the branch changed chunks or arrays this
            transaction changes (each named: kind, array, chunks); nothing is committed.
        ValueError
            Nothing was merged.
        """
        self._check_open("commit")
        if not self.session.has_uncommitted_changes:
            raise ValueError(f"nothing to commit on branch {self.branch!r}: no fork was merged into the transaction")
        icechunk = import_icechunk()
        try:
            snapshot = self.session.commit(message, metadata=metadata, rebase_with=icechunk.ConflictDetector())
        except icechunk.RebaseFailedError as exc:
            lines = rebase_conflicts(exc.conflicts)
            raise WriteConflictError(
                f"cannot commit to branch {self.branch!r}: commits made there since snapshot {self.base} changed what "
                f"this transaction writes: {'; '.join(lines)}. Nothing was committed",
                lines,
            ) from exc
        except icechunk.ConflictError as exc:
            raise WriteConflictError(
                f"cannot commit to branch {self.branch!r}: it moved from {exc.expected_parent} to {exc.actual_parent} "
                "while committing. Nothing was committed"
            ) from exc
        self.snapshot = str(snapshot)
        for done in self._on_commit:
            done()
        return self.snapshot

    # -- across scheduler tasks (write.icechunk_handoff) ----------------------------------
    def hand_off(self, handoff: Store | str | os.PathLike[str]) -> None:
        """Write the base fork to ``handoff`` (a shared directory, a bucket URL or a zarr store) for scheduler tasks.

        Each task writes its slots through ``with icechunk_fork(handoff) as store:``;
        :meth:`collect` later merges what they saved.

        Raises
        ------
        FileExistsError
            ``handoff`` holds a transaction not yet collected and committed.
        """
        self._check_open("hand off")
        write_transaction(handoff_store(handoff), self.fork(), self.branch, self.base)

    @classmethod
    def collect(
        cls, repo: Repository | Storage | str | os.PathLike[str], handoff: Store | str | os.PathLike[str]
    ) -> IcechunkTransaction:
        """A transaction on the handed-off branch's tip with every fork saved at ``handoff`` merged.

        Its :meth:`commit` clears the handoff. Collecting again before
        committing starts over (nothing is merged twice). If the branch moved
        since the handoff, the commits made since must touch nothing the forks wrote.

        Raises
        ------
        FileNotFoundError
            No transaction was handed off at ``handoff``.
        WriteConflictError
            Two saved forks wrote one slot, chunk or node, or commits made on
            the branch since the handoff did (each clash named).
        """
        store = handoff_store(handoff)
        branch, base = read_transaction(store)
        tx = cls(repo, branch)
        if tx.base != base:  # the forks are of the handoff's snapshot: what the branch changed since must stay apart
            moved = tx.repo.diff(from_snapshot_id=base, to_branch=branch)
            tx._ledger.add(
                ForkChanges.of(moved, label=f"commits on branch {branch!r} since the handoff's snapshot {base}")
            )
            tx._bases.add(base)
        for fork in saved_forks(store):
            tx.merge(fork)
        tx._on_commit.append(functools.partial(clear_handoff, store))
        return tx

    def _check_open(self, verb: str) -> None:
        if self.snapshot is not None:
            raise ValueError(
                f"this transaction was committed as snapshot {self.snapshot}; it cannot {verb} any more: "
                "open a new IcechunkTransaction"
            )

    def __repr__(self) -> str:
        state = f"committed as {self.snapshot}" if self.snapshot else f"{len(self.merged)} slots merged"
        return f"IcechunkTransaction(branch={self.branch!r}, base={self.base!r}, {state})"
