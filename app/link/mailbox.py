"""An async actor that hands each message to every rank and collects their replies.

A message no rank has taken yet can still have commands replaced (a cancelled operation becomes a no-op);
once the first rank takes it, every rank runs the same commands.

Messages reach the ranks in msg_id order, whatever order their calls run in: Ray runs an async actor's calls out
of order (allow_out_of_order_execution is forced on), and a model's operations must run in the order they were sent.
The sender numbers its messages 1, 2, 3, ...; a call waits until the one before it was queued.

Ranks register with a per-process identity. When a rank re-registers with a new identity (the group
restarted), every pending message fails with GroupRestarted instead of hanging, naming the request ids of the
commands the ranks were running when they died (what may have killed them: app.trainer.worker_deaths).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.errors import GroupRestarted
from app.link.shipping import Shipped
from app.messages import RankReply, Replies, WorkerCommand

logger = logging.getLogger("tinker_serve.trainer")
Message = tuple[int, list[Shipped]]  # (msg_id, its commands)
Answer = tuple[int, list[RankReply]]  # (msg_id, a rank's reply to each of its commands)


@dataclass(frozen=True)
class Stop:
    """What stop() hands every rank instead of a message: its loop ends."""


# How long a message waits for the one numbered before it. Their calls are sent back to back, so that one is at most
# moments late; one that never comes (its sending failed in the trainer) must not hold up every later message.
MESSAGE_GAP_TIMEOUT_S = 10.0


class Mailbox:
    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._identities: dict[int, str] = {}
        self._queues: dict[int, asyncio.Queue[Message | Stop]] = {r: asyncio.Queue() for r in range(world_size)}
        # msg_id -> the replies to it, in rank order once every rank answered, and those so far: rank -> its answer
        self._pending: dict[int, tuple[asyncio.Future[Replies], dict[int, list[RankReply]]]] = {}
        self._untaken: dict[int, list[Shipped]] = {}  # messages no rank has taken yet: msg_id -> its commands
        self._taken: dict[int, Message] = {}  # rank -> the message (msg_id, commands) it took, unanswered
        self._restarts = 0
        self._next_msg_id = 1  # the msg_id whose turn it is to be queued
        self._turn = asyncio.Condition()

    async def register(self, rank: int, identity: str) -> None:
        previous = self._identities.get(rank)
        self._identities[rank] = identity
        if previous is not None and previous != identity:
            self._restarts += 1
            self._identities = {rank: identity}
            running = await self.running()
            for fut, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(
                        GroupRestarted(
                            "a training worker restarted while this request ran; models on this trainer were lost. "
                            "Recreate the model or load a checkpoint, then retry",
                            running=running,
                        )
                    )
            self._pending.clear()
            self._untaken.clear()
            self._taken.clear()
            self._queues = {r: asyncio.Queue() for r in range(self._world_size)}

    async def status(self) -> dict[str, int]:
        return {"registered": len(self._identities), "world_size": self._world_size, "restarts": self._restarts}

    async def identities(self) -> dict[int, str]:
        """The identity each registered rank gave (its command loop's `{pid}-{nonce}`)."""
        return dict(self._identities)

    async def running(self) -> tuple[str, ...]:
        """The request ids of the commands in the messages some rank has taken and not answered, oldest first."""
        messages = dict(sorted(self._taken.values(), key=lambda taken: taken[0]))
        ids = (command.request_id for commands in messages.values() for command in commands)
        return tuple(dict.fromkeys(request_id for request_id in ids if request_id))

    async def call(self, msg_id: int, commands: list[Shipped], generation: int | None = None) -> Replies:
        """Send `commands` to every rank once every message numbered before `msg_id` was; returns the replies ordered
        by rank. A sender that knows the group as of `generation` restarts gets GroupRestarted at once if it restarted
        since (its models are not there)."""
        self._untaken[msg_id] = commands  # the very list every rank's queue will hold; cancellable from now on
        async with self._turn:
            try:
                await asyncio.wait_for(self._turn.wait_for(lambda: msg_id <= self._next_msg_id), MESSAGE_GAP_TIMEOUT_S)
            except TimeoutError:  # the messages before it never came: the rest goes on without them
                logger.warning(
                    "messages %d..%d never reached the mailbox; message %d goes on",
                    self._next_msg_id,
                    msg_id - 1,
                    msg_id,
                )
            self._next_msg_id = max(self._next_msg_id, msg_id + 1)
            self._turn.notify_all()
            if generation is not None and generation != self._restarts:
                self._untaken.pop(msg_id, None)
                raise GroupRestarted("the worker group restarted since this trainer last rebuilt its models")
            fut: asyncio.Future[Replies] = asyncio.get_running_loop().create_future()
            self._pending[msg_id] = (fut, {})
            for queue in self._queues.values():
                queue.put_nowait((msg_id, commands))
        return await fut

    async def next(self, rank: int, timeout_s: float, answer: Answer | None = None) -> Message | Stop | None:
        """The rank's next message (msg_id, commands), Stop, or None after `timeout_s`. `answer`: the (msg_id,
        replies) of the message the rank ran last, delivered first, so a rank makes one call per message rather than
        two."""
        if answer is not None:
            await self.reply(answer[0], rank, answer[1])
        try:
            message = await asyncio.wait_for(self._queues[rank].get(), timeout_s)
        except TimeoutError:
            return None
        if isinstance(message, Stop):
            return message
        self._untaken.pop(message[0], None)
        self._taken[rank] = message
        return message

    async def cancel(self, request_id: str, replacement: WorkerCommand) -> bool:
        """Replace the commands serving `request_id` in messages no rank has taken; whether there were any."""
        found = False
        for commands in self._untaken.values():
            for i, command in enumerate(commands):
                if command.request_id == request_id:
                    commands[i] = replacement
                    found = True
        return found

    async def reply(self, msg_id: int, rank: int, result: list[RankReply]) -> None:
        if self._taken.get(rank, (None,))[0] == msg_id:
            del self._taken[rank]
        entry = self._pending.get(msg_id)
        if entry is None:
            return  # the message was failed by a restart
        fut, replies = entry
        replies[rank] = result
        if len(replies) == self._world_size:
            del self._pending[msg_id]
            if not fut.done():
                fut.set_result([replies[r] for r in range(self._world_size)])

    async def stop(self) -> None:
        for queue in self._queues.values():
            queue.put_nowait(Stop())
