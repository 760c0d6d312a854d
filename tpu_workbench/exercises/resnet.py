"""The resnet notebook's exercise: how many times the FLOPs of one image does ImageNet's
ResNet-18 (224x224, a 7x7 stride-2 stem and a max-pool) need against the page's ``tiny``
(16x16, a 3x3 stride-1 stem, no max-pool)? Both have the same blocks; what differs is the size of
the feature maps they run on, which the reader works out from the architecture the page states.
The page shows tiny's FLOPs and no FLOPs of resnet18."""

from __future__ import annotations

from . import typed_number

BIG, SMALL = "resnet18", "tiny"
TOLERANCE = 0.10  # the four stages alone (12.25x) are within 7%; the stem is the rest


def ratio_facts(big: str = BIG, small: str = SMALL) -> dict:
    """What :func:`judge_ratio` needs: the forward pass's multiply-adds of one image under each
    preset (counted with hooks on the meta device, :func:`tpu_workbench.models.resnet.
    _macs_per_image`), their image sizes and the feature-map sizes of the four stages."""
    from ..models import get_model
    from ..models.resnet import _macs_per_image

    family = get_model("resnet")
    out: dict = {}
    for key, preset in (("big", big), ("small", small)):
        cfg = family.config(preset)
        first = cfg.image_size // (1 if cfg.cifar_stem else 4)  # stem stride 2, max-pool 2
        out[key] = {"preset": preset, "image_size": cfg.image_size,
                    "macs": _macs_per_image(cfg), "num_classes": cfg.num_classes,
                    "stages": [first // 2**i for i in range(4)]}
    out["ratio"] = out["big"]["macs"] / out["small"]["macs"]
    return out


def _worked(f: dict) -> str:
    big, small = f["big"], f["small"]
    area = (big["stages"][0] / small["stages"][0]) ** 2
    return (f"The four stages run on {' / '.join(map(str, big['stages']))} pixel-wide maps in "
            f"`{big['preset']}` against {' / '.join(map(str, small['stages']))} in "
            f"`{small['preset']}`, so every block costs {area:.2f}x: the stride-2 stem and the "
            f"max-pool shrink 224 to {big['stages'][0]} before the first block. The 7x7 stem "
            f"itself, run at {big['image_size'] // 2}x{big['image_size'] // 2}, adds about "
            f"another stage's worth: {big['macs'] / 1e9:.2f} G multiply-adds against "
            f"{small['macs'] / 1e6:.0f} M, **{f['ratio']:.1f}x**, not the "
            f"{(big['image_size'] / small['image_size']) ** 2:.0f}x of the pixel counts.")


def judge_ratio(answer: str | None, facts: dict) -> tuple[str, str]:
    """``(callout kind, markdown)`` for `answer` (a ratio, as typed, "13" or "13x") against
    `facts` (:func:`ratio_facts`): right within :data:`TOLERANCE`. Pure: starts nothing."""
    text = str(answer if answer is not None else "").strip()
    said = typed_number(text, "x")
    if said is None:
        return "warn", (f"{text!r} is not a number: enter how many times the FLOPs, such as "
                        "`20` or `20x`.")
    if not 0 < said < 1e6:
        return "warn", f"{said:g} is out of range: enter a ratio above 0 and below 1,000,000."
    right = facts["ratio"]
    if abs(said - right) <= TOLERANCE * right:
        return "success", f"**Right: {right:.1f}x** (you said {said:g}x). " + _worked(facts)
    pixels = (facts["big"]["image_size"] / facts["small"]["image_size"]) ** 2
    if abs(said - pixels) <= TOLERANCE * pixels:
        hint = ("That is the ratio of the input pixels. Which layers shrink the 224x224 image "
                "before the first residual block, and by how much?")
    elif said < right:
        hint = ("Too few: the blocks are the same, but how wide is the feature map each stage "
                "of the ImageNet model runs on?")
    else:
        hint = ("Too many: the ImageNet stem is stride 2 and followed by a max-pool; the tiny "
                "stem keeps the full 16x16.")
    return "warn", f"You said {said:g}x; not quite. {hint}"
