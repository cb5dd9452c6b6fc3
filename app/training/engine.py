"""One rank's training engine: a base model, its LoRA adapters, their optimizers, and the math.

Pure torch: it runs the same inside a Ray Train worker or a unit test. With world_size > 1 each rank
takes every world_size-th datum, and a datum too long for one rank runs on a sequence-parallel group of ranks
together (app.training.datum_layout, app.training.sequence_parallel); gradients are summed across ranks at
optim_step (Tinker losses are sums, so SUM is exact).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from app.errors import NotFound, TinkerServeError, UserError
from app.messages import AdapterSpec, ForwardBackwardArgs, OptimParams, PassLayout, ShardOutput
from app.training import checkpoint
from app.training.base_model import reshard
from app.training.datum_layout import DatumLayout
from app.training.grads import all_reduce_sum_grads, failed_on_any_rank, give_back_grads, take_grads
from app.training.loaded_model import LoadedModel
from app.training.logprobs import target_logprobs
from app.training.lora import AdapterPool
from app.training.loss_step import LossResult, LossStep, Stats, joined, loss_error
from app.training.micro_batches import fits_one_pass, micro_batches
from app.training.mixed_pass import MixedPass
from app.training.optim import apply_step, make_optimizer
from app.training.rows import padded, unpadded
from app.training.sequence_parallel import SequenceGroup, gather_tokens
from app.training.vision import VisionTower
from app.training_data.batch import PackedBatch
from app.training_data.custom_losses import CustomLossProgram

DEFAULT_MICRO_BATCH_TOKENS = 16384
Finish = Callable[[torch.Tensor], LossResult] | None  # a pass's loss from its predictions (LossStep.prepare)


class TrainingEngine:
    def __init__(
        self,
        base: torch.nn.Module,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str = "cpu",
        micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS,
        sharded: bool = False,
        autocast: bool = False,
        sequence_parallel: int = 1,
        sequence_parallel_min_tokens: int = 4096,
        vision: VisionTower | None = None,
    ) -> None:
        """`base`: loaded by app.training.base_model (on `device`, or sharded with `shard_base`: then `sharded`, and
        every rank runs as many passes as the busiest one). `autocast`: forward passes run under bf16 autocast,
        the adapters' matmuls included (their weights, gradients and optimizer state stay float32). A datum of more
        than `sequence_parallel_min_tokens` runs on a group of `sequence_parallel` ranks (its heads must divide by
        it: app.training.datum_layout.sequence_parallel_size); every rank must construct the engine alike. `vision`:
        a vision-language base's frozen vision tower (app.training.vision), which embeds a batch's images."""
        self.vision = vision
        self.rank = rank
        self.world_size = world_size
        self.layout = DatumLayout(world_size, sequence_parallel, sequence_parallel_min_tokens)
        self._sequence_group: SequenceGroup | None = None
        if sequence_parallel > 1:
            groups = [SequenceGroup(self.layout.group_ranks(g), rank) for g in range(self.layout.groups)]
            self._sequence_group = groups[self.layout.group_of(rank)]
        self.device = torch.device(device)
        self.micro_batch_tokens = micro_batch_tokens
        self.sharded = sharded
        self._autocast = autocast
        # one token's forward and backward through the base, ~6 FLOPs a parameter: what a custom loss's estimated
        # FLOPs are counted in (its cost in the fair share)
        self.token_flops = max(1, 6 * sum(p.numel() for p in base.parameters()))
        self.pool = AdapterPool(base, cast_inputs=not autocast)
        self._models: dict[str, LoadedModel] = {}
        self._next_name = 0

    # -- adapters -----------------------------------------------------------------------------
    def create_model(self, model_id: str, spec: AdapterSpec) -> None:
        if model_id in self._models:
            return  # a retried command: the adapter exists already
        name = f"m{self._next_name}"
        self._next_name += 1
        params = self.pool.add(name, spec)
        head = self._value_head() if spec.role == "critic" else None
        if head is not None:
            params = [*params, *head.parameters()]
        self._models[model_id] = LoadedModel(name, spec, params, make_optimizer(params, spec.optimizer), head)

    def _value_head(self) -> torch.nn.Linear:
        """A scalar head on the final hidden state, in float32; zero-initialised, so new critics predict 0."""
        head = torch.nn.Linear(
            self.pool.model.config.get_text_config().hidden_size, 1, device=self.device, dtype=torch.float32
        )
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        return head

    def remove_model(self, model_id: str) -> None:
        model = self._models.pop(model_id, None)
        if model is not None:
            self.pool.remove(model.name)

    def require_model(self, model_id: str) -> None:
        """NotFound unless the model is loaded here."""
        self.loaded(model_id)

    def loaded(self, model_id: str) -> LoadedModel:
        model = self._models.get(model_id)
        if model is None:
            raise NotFound(
                f"model {model_id!r} is not loaded on this trainer (a worker restart loses models held "
                "in memory): create it again or load a checkpoint",
                field="model_id",
            )
        return model

    def _activate(self, model_id: str) -> LoadedModel:
        model = self.loaded(model_id)
        self.pool.activate(model.name)
        return model

    # -- compute ------------------------------------------------------------------------------
    def forward_backward(
        self,
        model_id: str,
        loss_fn: str,
        config: dict[str, float],
        batch: PackedBatch,
        forward_only: bool,
        custom: CustomLossProgram | None = None,
    ) -> ShardOutput:
        """Run this rank's shard, in micro-batches of at most `micro_batch_tokens` padded tokens; gradients accumulate
        until optim_step. A policy outputs `logprobs` of the target tokens, a critic `values`; both `elementwise_loss`
        when the loss's inputs were sent. A custom loss (`custom`, loss_fn "custom") runs through its interpreter and
        reports its own metrics. A loss that fails on this rank's data still runs its (zero) backward, so ranks of a
        sharded base stay in step; the error is raised after the last pass. When any rank fails the operation, every
        rank drops the gradients it added (the model stays as if it was never sent)."""
        model = self._activate(model_id)
        self._check_images(batch)
        loss = LossStep(loss_fn, config, custom, self.device, batch)
        whole = self.layout.whole_datums(batch.lengths, self.rank)
        split = self.layout.split_datums(batch.lengths, self.rank)
        answered = np.concatenate([whole, split]) if self.layout.reports(self.rank) else whole
        earlier = None if forward_only else take_grads(model.params)  # this op's gradients apart until it succeeds
        parts: list[tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]]]] = []
        error: Exception | None = None  # the loss's (the passes all ran)
        raised: Exception | None = None  # a pass's (replicated base: the other ranks are not left waiting)
        try:
            error = self._run_passes(model, batch, batch.select(whole), loss, forward_only, parts)
            error = self._run_split_passes(model, batch, split, loss, forward_only, parts) or error
        except Exception as exc:
            if self.sharded:  # mid-pass: the other ranks wait in a gather this rank will not join (see execute)
                raise
            raised = exc
        self._release_gathered()
        if earlier is not None:  # every rank keeps this op's gradients, or none does
            (failed,) = failed_on_any_rank([error is not None or raised is not None], self.device)
            give_back_grads(model.params, earlier, keep_current=not failed)
        if raised is not None:
            raise raised
        if error is not None:
            raise loss_error(loss_fn, error)
        if not self.layout.reports(self.rank):
            parts = parts[: len(parts) - len(split)]  # the group's first rank answers for its split datums
        offsets = batch.select(answered).offsets
        return ShardOutput(answered, offsets, *joined(parts), loss_cost_tokens=loss.flops // self.token_flops)

    def forward_backward_many(
        self, requests: Sequence[tuple[str, ForwardBackwardArgs]]
    ) -> list[ShardOutput | TinkerServeError]:
        """Several models' forward(_backward)s, each as `forward_backward` would answer it (or its error: a failed
        one fails only itself). When they `mix`, they run as one pass over the base, each row through its own
        model's adapter (AdapterPool.segments: one LoRA product per adapter and layer over its rows), with one backward;
        gradients reach each adapter apart, so each model's outputs and gradients are its own alone, and each answer
        carries the pass's layout (what `replay` needs). Otherwise one after another."""
        if not self.mix(requests):
            return [self._answer_alone(model_id, args) for model_id, args in requests]
        return self._mixed_pass(requests)

    def mix(self, requests: Sequence[tuple[str, ForwardBackwardArgs]]) -> bool:
        """Whether these requests run as one pass: two or more distinct models on a base whose adapters mix, and
        every rank's share within one micro-batch. Read from the whole requests, so every rank decides alike."""
        ids = [model_id for model_id, _ in requests]
        if len(ids) < 2 or len(set(ids)) != len(ids) or not self.pool.can_mix():
            return False
        if any(self.layout.split(args.batch.lengths).any() or args.batch.images for _, args in requests):
            return False
        return fits_one_pass([args.batch.lengths for _, args in requests], self.world_size, self.micro_batch_tokens)

    def replay(self, model_id: str, args: ForwardBackwardArgs, layout: PassLayout) -> ShardOutput:
        """Run the model's request as it ran in the mixed pass `layout` describes, bit for bit: the other members
        are stand-ins of the same shape (adapters of their specs, rows of their lengths, no loss). A row's results
        depend on the other rows' shapes only (the same kernels), not on their values, so this equals the original
        for the model's own rows and gradients (app.trainer.recovery rebuilds models apart from each other)."""
        requests: list[tuple[str, ForwardBackwardArgs]] = []
        stand_ins: list[str] = []
        try:
            for i, member in enumerate(layout.members):
                if i == layout.own:
                    requests.append((model_id, args))
                    continue
                stand_in = f"\x00stand-in-{i}"  # no model id the ingress gives out
                self.create_model(stand_in, replace(member.spec, role="policy", optimizer="adamw"))
                stand_ins.append(stand_in)
                requests.append((stand_in, _stand_in_args(member.lengths)))
            answer = self._mixed_pass(requests)[layout.own]
        finally:
            for stand_in in stand_ins:
                self.remove_model(stand_in)
        if isinstance(answer, TinkerServeError):
            raise answer
        return answer

    def _mixed_pass(self, requests: Sequence[tuple[str, ForwardBackwardArgs]]) -> list[ShardOutput | TinkerServeError]:
        answers = MixedPass(self, requests).run()
        self._release_gathered()
        return answers

    def _release_gathered(self) -> None:
        """After an operation's passes, a sharded base keeps no gathered weights (app.training.base_model.reshard)."""
        if self.sharded:
            reshard(self.pool.model)

    def _answer_alone(self, model_id: str, args: ForwardBackwardArgs) -> ShardOutput | TinkerServeError:
        try:
            return self.forward_backward(
                model_id, args.loss_fn, args.loss_config, args.batch, args.forward_only, args.custom_loss
            )
        except TinkerServeError as exc:
            return exc

    def _check_images(self, batch: PackedBatch) -> None:
        """Images need this base's vision tower, and run in whole-datum passes (not split across ranks)."""
        if not batch.images:
            return
        first = batch.images[0].field
        if self.vision is None:
            raise UserError(f"{first} is an image; this base model is text-only", field=first)
        split = self.layout.split(batch.lengths)
        if any(split[image.datum] for image in batch.images):
            raise UserError(
                f"{first}: a datum with images is not split across ranks; keep it within "
                "trainer.sequence_parallel_min_tokens tokens",
                field=first,
            )

    def _run_passes(
        self,
        model: LoadedModel,
        batch: PackedBatch,
        shard: PackedBatch,
        loss: LossStep,
        forward_only: bool,
        parts: list[tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]]]],
    ) -> Exception | None:
        """This rank's passes, their answers appended to `parts`; the loss's first error, raised by no pass."""
        runs = micro_batches(shard.lengths, self.micro_batch_tokens)
        error: Exception | None = None
        for i in range(self._passes(batch, len(runs))):
            if i >= len(runs):  # backward only where the real passes have a loss to backpropagate
                self.idle_pass(model, forward_only or not loss.applies(batch))
                continue
            part = shard.select(np.arange(runs[i].start, runs[i].stop))
            outputs, loss_sum, stats, failure = self._pass(model, part, loss, forward_only)
            parts.append((outputs, loss_sum, stats))
            error = error or failure
        return error

    def _passes(self, batch: PackedBatch, own: int) -> int:
        """How many passes of whole datums this rank runs: its micro-batches; with a sharded base, the most any rank
        has."""
        if not self.sharded:
            return own
        lengths, layout = batch.lengths, self.layout
        return max(
            len(micro_batches(lengths[layout.whole_datums(lengths, r)], self.micro_batch_tokens))
            for r in range(self.world_size)
        )

    def _run_split_passes(
        self,
        model: LoadedModel,
        batch: PackedBatch,
        split: np.ndarray,
        loss: LossStep,
        forward_only: bool,
        parts: list[tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]]]],
    ) -> Exception | None:
        """One pass for each split datum of this rank's group, run by the group together (appended to `parts`); with
        a sharded base, idle passes up to the most any group has. The loss's first error, raised by no pass."""
        error: Exception | None = None
        for index in split.tolist():
            outputs, loss_sum, stats, failure = self._split_pass(model, batch.select([index]), loss, forward_only)
            parts.append((outputs, loss_sum, stats))
            error = error or failure
        if self.sharded:
            lengths, layout = batch.lengths, self.layout
            most = max(len(layout.split_datums(lengths, r)) for r in range(self.world_size))
            for _ in range(most - len(split)):
                self.idle_pass(model, forward_only or not loss.applies(batch))
        return error

    def _pass(
        self, model: LoadedModel, part: PackedBatch, loss: LossStep, forward_only: bool
    ) -> tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]], Exception | None]:
        """One micro-batch's forward (and backward): its outputs, loss, metrics, and the loss's error if it failed."""
        with torch.set_grad_enabled(not forward_only):
            input_ids, mask = padded([part], self.device)
            # Every host-to-device copy before the forward: a blocking copy waits for the work queued ahead of it.
            finish = loss.prepare(part)
            with self._image_inputs(part, input_ids) as images:
                if model.value_head is None:
                    name, prediction = "logprobs", self._target_logprobs(part, input_ids, mask, **images)
                else:
                    name, prediction = "values", self._values(model.value_head, part, input_ids, mask, **images)
            return self._finish_pass(name, prediction, finish, forward_only, in_step=self.sharded)

    def _split_pass(
        self, model: LoadedModel, datum: PackedBatch, loss: LossStep, forward_only: bool
    ) -> tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]], Exception | None]:
        """One datum's forward (and backward) on this rank's sequence-parallel group, each rank its own slice of
        the tokens at their positions in the datum; the predictions gathered whole on every rank, which each
        computes the loss from (as `_pass` answers)."""
        group = self._sequence_group
        assert group is not None
        length = datum.num_tokens
        start, stop = group.span(length)
        per = group.slice_length(length)
        input_ids = torch.zeros((1, per), dtype=torch.long)  # the last slice is padded at its end: causal, unread
        input_ids[0, : stop - start] = torch.from_numpy(datum.tokens[start:stop])
        positions = torch.arange(group.index * per, (group.index + 1) * per)[None]
        with torch.set_grad_enabled(not forward_only), group.running():
            input_ids, positions = input_ids.to(self.device), positions.to(self.device)
            finish = loss.prepare(datum)
            if model.value_head is None:
                targets = torch.from_numpy(datum.loss_inputs["target_tokens"][start:stop]).to(self.device).long()
                logits = self.forward(input_ids, None, position_ids=positions).logits[0, : stop - start]
                name, own = "logprobs", target_logprobs(logits, targets)
            else:
                with self.capturing_hidden() as hidden:
                    self.forward(input_ids, None, position_ids=positions, logits_to_keep=1)
                name, own = "values", model.value_head(hidden[0][0, : stop - start].float()).squeeze(-1)
            prediction = gather_tokens(own, group, length)
            return self._finish_pass(name, prediction, finish, forward_only, in_step=True)

    def _finish_pass(
        self, name: str, prediction: torch.Tensor, finish: Finish, forward_only: bool, in_step: bool
    ) -> tuple[dict[str, np.ndarray], float, dict[str, tuple[float, float]], Exception | None]:
        """A pass's loss from its predictions (`finish`: LossStep.prepare's) and its backward: its outputs, loss,
        metrics, and the loss's error if it failed. `in_step`: other ranks wait in this pass's backward
        (a sharded base's gathers, a sequence-parallel group's exchanges), so a failed loss backpropagates its zero."""
        outputs, total, error = {name: prediction}, prediction.new_zeros(()), None
        stats: Stats = {}
        if finish is not None:  # a critic's forward may ask for values only
            try:
                total, extra, stats = finish(prediction)
                outputs.update(extra)
            except Exception as exc:  # noqa: BLE001 - raised once every pass has run
                error, total = exc, prediction.sum() * 0
            if not forward_only and (error is None or in_step):
                total.backward()
        arrays = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in outputs.items()}
        return arrays, float(total.detach()), stats, error

    def idle_pass(self, model: LoadedModel, forward_only: bool) -> None:
        """A one-token pass with a zero loss, through the same modules as a real one: with a sharded base, a rank
        with fewer micro-batches than another still joins each weight gather."""
        input_ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        mask = torch.ones_like(input_ids)
        with torch.set_grad_enabled(not forward_only):
            if model.value_head is None:
                out = self._logits(input_ids, mask)
            else:
                out = model.value_head(self._hidden(input_ids, mask).float())
            if not forward_only:
                (out.float().sum() * 0).backward()

    def forward(self, input_ids: torch.Tensor | None, mask: torch.Tensor | None, **kwargs: Any) -> Any:
        """The adapted model's forward (no KV cache: nothing is generated); with `inputs_embeds` (a micro-batch with
        images: `_image_inputs`) the token ids are not read."""
        if "inputs_embeds" in kwargs:
            input_ids = None
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
            return self.pool.model(input_ids=input_ids, attention_mask=mask, use_cache=False, **kwargs)

    def _image_inputs(
        self, part: PackedBatch, input_ids: torch.Tensor
    ) -> contextlib.AbstractContextManager[dict[str, torch.Tensor]]:
        """A micro-batch's images as the forward takes them, within it: input embeddings with the vision tower's in
        place, multimodal positions, and a DeepStack tower's features joining the first layers (app.training.vision);
        none without images."""
        if not part.images or self.vision is None:
            return contextlib.nullcontext({})
        return self.vision.inputs(part, input_ids, self.pool.model)

    def _logits(self, input_ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.forward(input_ids, mask, **kwargs).logits

    def _target_logprobs(
        self, shard: PackedBatch, input_ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        """Log-probabilities of target_tokens, flat over the shard: [T] or [T, K]."""
        targets = torch.from_numpy(shard.loss_inputs["target_tokens"]).to(self.device).long()
        return target_logprobs(unpadded(self._logits(input_ids, mask, **kwargs), shard.lengths), targets)

    def _hidden(self, input_ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The backbone's final hidden states [N, L, hidden]. The call goes through the whole model, as a policy's
        does (a sharded base gathers its outer weights there), with the LM head applied to the last position only."""
        with self.capturing_hidden() as captured:
            self.forward(input_ids, mask, logits_to_keep=1, **kwargs)
        return captured[0]

    @contextlib.contextmanager
    def capturing_hidden(self) -> Iterator[list[torch.Tensor]]:
        """Within it, each forward appends the backbone's final hidden states [N, L, hidden] to the list given."""
        captured: list[torch.Tensor] = []
        backbone = cast(torch.nn.Module, self.pool.model.get_base_model().base_model)  # a submodule, not a tensor
        hook = backbone.register_forward_hook(lambda _m, _args, out: captured.append(out.last_hidden_state))
        try:
            yield captured
        finally:
            hook.remove()

    def _values(
        self, head: torch.nn.Linear, shard: PackedBatch, input_ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        """The critic's value of each position (after reading that token), flat over the shard: [T]."""
        return head(unpadded(self._hidden(input_ids, mask, **kwargs), shard.lengths).float()).squeeze(-1)

    def optim_step(self, model_id: str, hp: OptimParams) -> dict[str, float]:
        model = self._activate(model_id)
        if self.world_size > 1:
            all_reduce_sum_grads(model.params)
        norm = apply_step(model.optimizer, model.params, hp)
        return {"grad_norm:mean": norm}

    # -- checkpoints: `out` is a directory to create, `directory` a local one to read -----------------
    def save_adapter(self, model_id: str, out: Path) -> None:
        """Write the model's adapter as a PEFT adapter directory (what samplers load)."""
        checkpoint.write_adapter(self.pool.model, self.loaded(model_id).name, out)

    def save_state(self, model_id: str, out: Path) -> None:
        """Write a training checkpoint: adapter, value head, optimizer state and spec."""
        model = self.loaded(model_id)
        checkpoint.write_state(self.pool.model, model.name, model.spec, model.value_head, model.optimizer, out)

    def save_export(self, model_id: str, out: Path) -> None:
        """Write a download: a policy's PEFT adapter (Hugging Face format), or a critic's whole training state
        (its value head and spec are part of it)."""
        save = self.save_state if self.loaded(model_id).spec.role == "critic" else self.save_adapter
        save(model_id, out)

    def capture_state(self, model_id: str) -> checkpoint.TrainingState:
        """A copy of the model's adapter, value head, optimizer state and spec (a snapshot to write)."""
        model = self.loaded(model_id)
        return checkpoint.capture_state(self.pool.model, model.name, model.spec, model.value_head, model.optimizer)

    def load_state(self, model_id: str, directory: Path, with_optimizer: bool) -> None:
        """Replace the model's weights (and optimizer state, or else a fresh optimizer) with a checkpoint's.
        Its spec must match the model's: same rank, adapted layers and role."""
        model = self.loaded(model_id)
        saved = checkpoint.read_spec(directory)
        if (saved.rank, saved.adapted(), saved.role, saved.alpha) != (
            model.spec.rank,
            model.spec.adapted(),
            model.spec.role,
            model.spec.alpha,
        ):
            raise UserError(
                f"the checkpoint holds a rank-{saved.rank} {saved.role} adapting {saved.adapted()}; this model is a "
                f"rank-{model.spec.rank} {model.spec.role} adapting {model.spec.adapted()}",
                field="path",
            )
        if with_optimizer and saved.optimizer != model.spec.optimizer:
            raise UserError(
                f"the checkpoint's optimizer state is {saved.optimizer}'s; this model uses {model.spec.optimizer}",
                field="path",
            )
        if not with_optimizer:
            model.optimizer = make_optimizer(model.params, model.spec.optimizer)
        checkpoint.load_state(
            self.pool.model,
            model.name,
            model.value_head,
            model.optimizer if with_optimizer else None,
            directory,
            self.device,
        )
        for p in model.params:
            p.grad = None

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        """The model's trainable parameters by name, value head included (tests compare them)."""
        model = self.loaded(model_id)
        state = {n: p.detach().clone() for n, p in self.pool.model.named_parameters() if f".{model.name}." in n}
        if model.value_head is not None:
            state.update({f"value_head.{n}": p.detach().clone() for n, p in model.value_head.named_parameters()})
        return state


def _stand_in_args(lengths: np.ndarray) -> ForwardBackwardArgs:
    """A forward of zero tokens with these datum lengths: a stand-in's rows in a replayed pass."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.zeros(int(offsets[-1]), dtype=np.int64)
    return ForwardBackwardArgs("cross_entropy", {}, True, PackedBatch(tokens, offsets, {"target_tokens": tokens}))
