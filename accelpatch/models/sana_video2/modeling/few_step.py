"""The sampler of the SANA-Video 2.0 4-step preview checkpoint as a diffusers scheduler.

``Efficient-Large-Model/SANA-Video_2.0_5B_720p_4step`` (T2V only, CFG 1, 81 frames) is said to sample in "four
fixed stages of a shifted DPM schedule (shift 6), stochastic: three transition-noise draws between stages". Its
sampling code was not read, so the stage values below are **(inferred)**: the flow shift of the uniform grid
``t = 1, 0.75, 0.5, 0.25``, ``sigma = shift·t / (1 + (shift - 1)·t)`` with shift 6 (sigmas 1, 18/19, 6/7, 2/3;
timesteps ``1000·sigma``). So is the update **(inferred)**: each stage turns the model's flow velocity ``v`` into a
clean estimate ``x0 = x - sigma·v`` and, between stages, noises it afresh to the next level, ``(1 - sigma_next)·x0 +
sigma_next·eps``, with ``eps`` drawn from the call's generator (three draws); the last stage returns ``x0``. The stage
values are config fields (``stage_fractions`` with ``shift``, or ``stage_sigmas``), so the real ones can be set once
they are known, and a saved pipeline keeps them.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

__all__ = ["FOUR_STEP_FRACTIONS", "FOUR_STEP_SHIFT", "SanaVideo2FewStepScheduler", "SanaVideo2FewStepSchedulerOutput",
           "shifted_sigma"]

#: The unshifted stage grid (inferred: four uniform stages from pure noise) and the shift the release names.
FOUR_STEP_FRACTIONS = (1.0, 0.75, 0.5, 0.25)
FOUR_STEP_SHIFT = 6.0


def shifted_sigma(t: float, shift: float) -> float:
    """The flow shift of a point ``t`` in [0, 1] of the unshifted grid: ``shift·t / (1 + (shift - 1)·t)``."""
    return shift * t / (1.0 + (shift - 1.0) * t)


@dataclass
class SanaVideo2FewStepSchedulerOutput(BaseOutput):
    """Output of :meth:`SanaVideo2FewStepScheduler.step`.

    Args:
        prev_sample (`torch.Tensor`): the input of the next stage (the clean estimate after the last stage).
        pred_original_sample (`torch.Tensor`): this stage's clean estimate ``x0 = x - sigma·v``.
    """

    prev_sample: torch.Tensor
    pred_original_sample: Optional[torch.Tensor] = None


def _levels(values: Sequence[float], name: str) -> tuple[float, ...]:
    """``values`` as floats, checked: at least one, each in (0, 1], strictly decreasing."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"`{name}` must be a non-empty sequence of numbers in (0, 1], got {values!r}")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"`{name}` must hold numbers, got {values!r}")
    levels = tuple(float(v) for v in values)
    if not all(0.0 < v <= 1.0 for v in levels) or any(b >= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"`{name}` must be strictly decreasing values in (0, 1], got {list(levels)}")
    return levels


class SanaVideo2FewStepScheduler(SchedulerMixin, ConfigMixin):
    r"""Fixed-stage stochastic flow sampler of the SANA-Video 2.0 4-step preview (stage values **inferred**; see the
    module docstring). Use it through :meth:`SanaVideo2Pipeline.four_step_scheduler` and call the pipeline with
    ``num_inference_steps=4, guidance_scale=1.0``.

    Each stage is one model call on a flow-matching latent ``x = (1 - sigma)·x0 + sigma·noise``, predicting the
    velocity ``v = noise - x0``: :meth:`step` forms ``x0 = x - sigma·v`` and returns, before the last stage,
    ``(1 - sigma_next)·x0 + sigma_next·eps`` with fresh ``eps`` from ``generator`` (one draw per transition, drawn
    per batch item for a list of generators, as diffusers' ``randn_tensor``), and after it ``x0``. Unlike a
    deterministic solver, the result depends on the generator beyond the initial noise.

    Args:
        num_train_timesteps: the timestep scale the model was trained on (timesteps are ``num_train_timesteps·sigma``).
        shift: the flow shift applied to ``stage_fractions``.
        stage_fractions: the unshifted stage grid, strictly decreasing in (0, 1] (inferred: 1, 0.75, 0.5, 0.25).
        stage_sigmas: the stage noise levels themselves, strictly decreasing in (0, 1]; when given, ``shift`` and
            ``stage_fractions`` are not used (for the checkpoint's real values once they are known).
    """

    _compatibles: list = []
    order = 1

    @register_to_config
    def __init__(
        self,
        num_train_timesteps: int = 1000,
        shift: float = FOUR_STEP_SHIFT,
        stage_fractions: Sequence[float] = FOUR_STEP_FRACTIONS,
        stage_sigmas: Optional[Sequence[float]] = None,
    ):
        if isinstance(num_train_timesteps, bool) or not isinstance(num_train_timesteps, numbers.Integral) \
                or num_train_timesteps < 1:
            raise ValueError(f"`num_train_timesteps` must be an int >= 1, got {num_train_timesteps!r}")
        if isinstance(shift, bool) or not isinstance(shift, numbers.Real) or not shift > 0:
            raise ValueError(f"`shift` must be a number > 0, got {shift!r}")
        if stage_sigmas is not None:
            self._stage_sigmas = _levels(stage_sigmas, "stage_sigmas")
        else:
            fractions = _levels(stage_fractions, "stage_fractions")
            self._stage_sigmas = tuple(shifted_sigma(t, float(shift)) for t in fractions)
        self.init_noise_sigma = 1.0
        self.num_inference_steps: Optional[int] = None
        self.timesteps: Optional[torch.Tensor] = None
        self.sigmas: Optional[torch.Tensor] = None
        self._step_index: Optional[int] = None
        self._begin_index: Optional[int] = None

    @property
    def num_stages(self) -> int:
        """The number of stages, the only ``num_inference_steps`` this scheduler runs."""
        return len(self._stage_sigmas)

    @property
    def step_index(self) -> Optional[int]:
        """The stage the next :meth:`step` runs (None before the first one)."""
        return self._step_index

    @property
    def begin_index(self) -> Optional[int]:
        """The first stage, when set by :meth:`set_begin_index`."""
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0) -> None:
        self._begin_index = begin_index

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    def set_timesteps(self, num_inference_steps: Optional[int] = None,
                      device: Union[str, torch.device, None] = None) -> None:
        """Set up the stages: ``timesteps`` (``num_train_timesteps·sigma``, on ``device``) and ``sigmas`` (the stage
        sigmas and a final 0, on the CPU). ``num_inference_steps`` must be None or the number of stages."""
        stages = self.num_stages
        if num_inference_steps is not None and (isinstance(num_inference_steps, bool) or
                                                not isinstance(num_inference_steps, numbers.Integral) or
                                                num_inference_steps != stages):
            raise ValueError(
                f"{type(self).__name__} samples in exactly {stages} fixed stages, so num_inference_steps must be "
                f"{stages}; got num_inference_steps={num_inference_steps!r} (pass num_inference_steps={stages}, or "
                "set `stage_sigmas` in the scheduler's config for another schedule)")
        scale = float(self.config.num_train_timesteps)
        self.timesteps = torch.tensor([scale * s for s in self._stage_sigmas], dtype=torch.float32, device=device)
        self.sigmas = torch.tensor([*self._stage_sigmas, 0.0], dtype=torch.float32)
        self.num_inference_steps = stages
        self._step_index = None
        self._begin_index = None

    def scale_model_input(self, sample: torch.Tensor, timestep: Union[float, torch.Tensor, None] = None
                          ) -> torch.Tensor:
        """The model input is the sample itself (flow matching scales nothing)."""
        return sample

    def index_for_timestep(self, timestep: Union[float, torch.Tensor]) -> int:
        """The stage whose timestep is ``timestep`` (ValueError when no stage has it)."""
        value = timestep.to(self.timesteps.device) if isinstance(timestep, torch.Tensor) else timestep
        matches = (self.timesteps == value).nonzero()
        if len(matches) == 0:
            raise ValueError(f"timestep {timestep!r} is not one of this scheduler's stage timesteps "
                             f"{self.timesteps.tolist()}")
        return int(matches[0])

    def step(
        self,
        model_output: torch.Tensor,
        timestep: Union[float, torch.Tensor],
        sample: torch.Tensor,
        generator: Union[torch.Generator, list[torch.Generator], None] = None,
        return_dict: bool = True,
    ) -> Union[SanaVideo2FewStepSchedulerOutput, tuple]:
        """Run one stage: ``x0 = sample - sigma·model_output`` (``model_output`` is the flow velocity), then the next
        stage's input ``(1 - sigma_next)·x0 + sigma_next·eps`` with ``eps`` drawn from ``generator`` in float32, or
        ``x0`` after the last stage. Computed in float32; returned in ``sample``'s dtype.

        Returns:
            :class:`SanaVideo2FewStepSchedulerOutput`, or ``(prev_sample, pred_original_sample)`` when
            ``return_dict`` is False.
        """
        if self.timesteps is None:
            raise ValueError(f"call {type(self).__name__}.set_timesteps() before step()")
        if self._step_index is None:
            self._step_index = self.index_for_timestep(timestep) if self._begin_index is None else self._begin_index
        index = self._step_index
        if index >= self.num_stages:
            raise ValueError(f"all {self.num_stages} stages have run; call set_timesteps() to sample again")
        sigma, sigma_next = self.sigmas[index], self.sigmas[index + 1]
        x = sample.to(torch.float32)
        x0 = x - sigma * model_output.to(torch.float32)
        if index + 1 < self.num_stages:  # a transition: noise the estimate afresh to the next stage's level
            noise = randn_tensor(x.shape, generator=generator, device=x.device, dtype=torch.float32)
            prev_sample = (1 - sigma_next) * x0 + sigma_next * noise
        else:
            prev_sample = x0
        self._step_index = index + 1
        prev_sample, x0 = prev_sample.to(sample.dtype), x0.to(sample.dtype)
        if not return_dict:
            return prev_sample, x0
        return SanaVideo2FewStepSchedulerOutput(prev_sample=prev_sample, pred_original_sample=x0)
