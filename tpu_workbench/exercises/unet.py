"""The unet notebook's exercise: how much of the picture is left halfway through the cosine
schedule. The reader predicts sqrt(alphas_cumprod[t]) at t = 500 of 1000 from the schedule's
formula on the page (Nichol & Dhariwal 2021): the angle is a quarter turn times t / T, so half
way it is 45 degrees and the picture's scale is cos(45 degrees) = 0.71, not 0.5."""

from __future__ import annotations

from . import typed_number

PRESET = "pictures16"
T = 500
TOLERANCE = 0.02  # absolute, on a scale from 0 to 1; cos(pi / 4) alone is 0.005 off


def signal_facts(preset: str = PRESET, t: int = T) -> dict:
    """What :func:`judge_signal` needs, read from diffusers' scheduler with the preset's config
    (:func:`tpu_workbench.models.unet.alphas_cumprod`): the picture's scale ``signal`` =
    sqrt(alphas_cumprod[t]) at `t`, the noise's scale ``noise``, the same picture's scale under
    the ``linear`` schedule, and the schedule's ``steps``."""
    from ..models import get_model
    from ..models.unet import alphas_cumprod

    cfg = get_model("unet").config(preset)
    acp = alphas_cumprod(cfg)
    linear = alphas_cumprod(get_model("unet").config(preset, beta_schedule="linear"))
    return {"preset": preset, "t": t, "steps": cfg.num_train_timesteps,
            "schedule": cfg.beta_schedule, "signal": float(acp[t].sqrt()),
            "noise": float((1 - acp[t]).sqrt()), "linear": float(linear[t].sqrt())}


def _worked(f: dict) -> str:
    return (f"The cosine schedule's angle grows in step with t, from 0 to 90°: at t = "
            f"{f['t']} of {f['steps']} it is (almost exactly) 45°, so the picture is scaled by "
            f"cos 45° and the noise by sin 45°: **{f['signal']:.3f}** and "
            f"{f['noise']:.3f} (the small offset s = 0.008 moves them by under 0.005). Half "
            "way through, signal and noise weigh the same; the linear schedule has "
            f"already cut the picture to {f['linear']:.3f} by then, which leaves many of its "
            "later steps with almost nothing to denoise.")


def _number(text: str) -> float | None:
    """A scale typed as a number from 0 to 1 or as a percentage."""
    value = typed_number(text, "%")
    return None if value is None else value / 100 if text.strip().endswith("%") else value


def judge_signal(answer: str | None, facts: dict) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (the picture's scale, a number from 0 to 1 or
    a percentage, as typed) against `facts` (:func:`signal_facts`): right within
    :data:`TOLERANCE`. Pure: it starts nothing and imports nothing."""
    text = str(answer if answer is not None else "").strip()
    said = _number(text)
    if said is None:
        return "warn", (f"{text!r} is not a number: enter the picture's scale as a number "
                        "from 0 to 1, such as `0.3`, or a percentage, such as `30%`.")
    if not 0 <= said <= 1:
        return "warn", (f"{said:g} is out of range: the picture's scale is a number from 0 to "
                        "1 (or a percentage from 0% to 100%).")
    right = facts["signal"]
    if abs(said - right) <= TOLERANCE:
        return "success", f"**Right: {right:.3f}.** " + _worked(facts)
    if abs(said - right**2) <= TOLERANCE or abs(said - 0.5) <= TOLERANCE:
        hint = ("That is close to alphas_cumprod itself, the picture's share of the noisy "
                "picture's variance; the question asks for its scale, the square root. (And "
                "if you reasoned \"half the steps, half the picture\": the schedule is a cosine "
                "of an angle that grows with t.)")
    elif abs(said - facts["linear"]) <= TOLERANCE:
        hint = "That is the linear schedule's scale; this page trains with the cosine one."
    elif said < right:
        hint = "Too little: the cosine schedule keeps more of the picture in its first half."
    else:
        hint = "Too much: by half way the noise has caught up a good deal."
    return "warn", f"You said {said:g}; not quite. {hint}"
