"""Custom losses made by create_custom_loss: validated programs stored by loss id, so every ingress replica
resolves a `forward_backward(loss_fn="custom", loss_fn_config={"loss_id": ...})` the same way. Each is one the
journal can hold (a forward_backward journals its loss): checked before it is stored, and again as it is read (a
row an earlier release stored)."""

from __future__ import annotations

import time

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.caches import remember
from app.db import journal_codec
from app.db.schema import custom_losses
from app.errors import NotFound, UserError
from app.training_data.custom_losses import CustomLossProgram


def loss_id_for(session_id: str, custom_loss_seq_id: int) -> str:
    return f"{session_id}:loss:{custom_loss_seq_id}"


class CustomLossStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db
        self._cache: dict[str, tuple[str, CustomLossProgram]] = {}  # stored losses never change

    async def add(self, session_id: str, program: CustomLossProgram) -> None:
        """Store the program under its loss id; a retried request finds it stored already. A user error naming the
        node the journal cannot hold."""
        unjournaled = _unjournaled(program)
        if unjournaled is not None:
            raise UserError(unjournaled[1], field=unjournaled[0])
        row = {
            "loss_id": program.loss_id,
            "session_id": session_id,
            "name": program.name,
            "program": program.to_json(),
            "created_at": time.time(),
        }
        try:
            async with self._db.begin() as conn:
                await conn.execute(insert(custom_losses).values(row))
        except IntegrityError:
            pass

    async def count(self, session_id: str) -> int:
        async with self._db.connect() as conn:
            query = select(func.count()).where(custom_losses.c.session_id == session_id)
            return (await conn.execute(query)).scalar_one()

    async def get(self, session_id: str, loss_id: str) -> CustomLossProgram:
        """The session's loss `loss_id`; another session's is as absent as one never made."""
        cached = self._cache.get(loss_id)
        if cached is None:
            async with self._db.connect() as conn:
                row = (await conn.execute(select(custom_losses).where(custom_losses.c.loss_id == loss_id))).first()
            if row is not None:
                program = CustomLossProgram.from_json(loss_id, row.program)
                unjournaled = _unjournaled(program)
                if unjournaled is not None and row.session_id == session_id:
                    raise UserError(
                        f"custom loss {loss_id!r} cannot run here: {unjournaled[1]}; create it again",
                        field="loss_fn_config.loss_id",
                    )
                cached = remember(self._cache, loss_id, (row.session_id, program), limit=10_000)
        if cached is None or cached[0] != session_id:
            raise NotFound(
                f"no custom loss {loss_id!r} in this session; create it with ServiceClient.create_custom_loss",
                field="loss_fn_config.loss_id",
            )
        return cached[1]


def _unjournaled(program: CustomLossProgram) -> tuple[str, str] | None:
    """The field and the reason of the first node the journal cannot encode, if any (an integer past 64 bits)."""
    for i, node in enumerate(program.nodes):
        try:
            journal_codec.encode_tree(node)
        except (TypeError, ValueError, OverflowError) as exc:
            field = f"graph.nodes[{i}]"
            return field, f"{field} ({node.name!r}) cannot be journaled: {exc}"
    return None
