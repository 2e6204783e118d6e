"""The models `distbench step` trains and `distbench plan` plans for, torch-free: a stack of
`layers` transformer layers, each an attention block then an MLP block (both residual, no bias
and no norm, as steps.models builds them), trained on `batch` samples of `seq_len` tokens per
step. Presets name common sizes; an explicit shape names every field.

The presets' MLP has no gate, so `ffn_size` is chosen to give the gated models' parameter count
(LLaMA's 3 x 11008 = 2 x 16512 at 7B); embeddings and the vocabulary are left out, so a preset
holds a little fewer parameters than its name."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from distbench.core.options import OptionError

EXAMPLE = "--model toy  or  --model layers=4,hidden=128,ffn=512,heads=4,seq=32,batch=16"


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    layers: int
    hidden_size: int
    ffn_size: int
    heads: int
    seq_len: int
    batch: int  # samples per step, over all data-parallel replicas and micro-batches

    @property
    def params_per_layer(self) -> int:
        # attention: fused qkv (3 h^2) and out (h^2); MLP: up and down (2 h ffn)
        return 4 * self.hidden_size ** 2 + 2 * self.hidden_size * self.ffn_size

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def flops_per_layer(self, tokens: int, tp: int = 1) -> float:
        """Forward plus backward of one layer on `tokens` tokens, one TP shard of it: 6 FLOPs
        per parameter and token for the matmuls, and the attention's scores and weighted sum
        (2 matmuls of seq x seq x hidden per sample, 3x for forward and backward)."""
        dense = 6 * tokens * self.params_per_layer
        attention = 3 * 2 * 2 * tokens * self.seq_len * self.hidden_size
        return (dense + attention) / tp

    def describe(self) -> str:
        return (f"{self.name}: {self.layers} layers, hidden {self.hidden_size}, ffn "
                f"{self.ffn_size}, heads {self.heads}, seq {self.seq_len}, batch {self.batch} "
                f"({self.params / 1e9:.3g}B parameters)" if self.params >= 1e8 else
                f"{self.name}: {self.layers} layers, hidden {self.hidden_size}, ffn "
                f"{self.ffn_size}, heads {self.heads}, seq {self.seq_len}, batch {self.batch} "
                f"({self.params:,} parameters)")

    def to_json(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelSpec] = {m.name: m for m in (
    # small enough for 4 gloo workers on 2 cores: a step of tens of ms
    ModelSpec(name="toy", layers=4, hidden_size=128, ffn_size=512, heads=4, seq_len=32,
              batch=16),
    ModelSpec(name="1b", layers=24, hidden_size=2048, ffn_size=8192, heads=16, seq_len=2048,
              batch=512),
    ModelSpec(name="7b", layers=32, hidden_size=4096, ffn_size=16512, heads=32, seq_len=4096,
              batch=1024),
    ModelSpec(name="13b", layers=40, hidden_size=5120, ffn_size=20736, heads=40, seq_len=4096,
              batch=1024),
    ModelSpec(name="70b", layers=80, hidden_size=8192, ffn_size=43008, heads=64, seq_len=4096,
              batch=1024),
)}

# explicit shape keys -> ModelSpec fields
KEYS = {"layers": "layers", "hidden": "hidden_size", "ffn": "ffn_size", "heads": "heads",
        "seq": "seq_len", "batch": "batch"}

# The most a shape may say of each key. A plan's and a step's layouts are arithmetic over the
# layers' and the batch's divisors, and a number with no bound made that arithmetic run for
# minutes (layers=10^9, batch=10^12; issue 30). Each bound is many times the largest public
# model's figure, so no real model is refused: 126 layers (Llama 3.1 405B; PaLM 118, GPT-3
# 96); hidden 20,480 (MT-NLG 530B; Llama 3.1 405B 16,384); ffn 73,728 (PaLM 540B; Llama 3.1
# 405B 53,248), and 4 x 2^20, the default for the largest hidden, is allowed; 128 heads;
# contexts of about a million tokens (10M claimed for Llama 4 Scout); global batches of a few
# million tokens (16M for Llama 3.1 405B: 2,048 samples of 8,192), so 2^24 samples even of one
# token each. Within these the largest plan is seconds (docs/plan.md gives the figures).
MAX_SHAPE = {"layers": 1024, "hidden": 2**20, "ffn": 2**22, "heads": 2**16, "seq": 2**24,
             "batch": 2**24}


def parse_model(option: str, text) -> ModelSpec:
    """A preset's name, or an explicit shape `layers=4,hidden=128,ffn=512,heads=4,seq=32,
    batch=16` (every key; ffn defaults to 4 x hidden). Raises OptionError."""
    raw = str(text).strip().lower()
    if raw in PRESETS:
        return PRESETS[raw]
    if "=" not in raw:
        raise OptionError(option, f"unknown model {raw!r} (presets: {', '.join(PRESETS)}; or a "
                          "shape)", EXAMPLE)
    values: dict[str, int] = {}
    for part in raw.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in KEYS:
            raise OptionError(option, f"unknown key {key!r} (keys: {', '.join(KEYS)})", EXAMPLE)
        try:
            number = int(value.strip())
        except ValueError:
            raise OptionError(option, f"{key}={value.strip()!r} is not a whole number",
                              EXAMPLE) from None
        if number < 1:
            raise OptionError(option, f"{key} must be at least 1, got {number}", EXAMPLE)
        if number > MAX_SHAPE[key]:
            raise OptionError(option, f"{key} must be at most {MAX_SHAPE[key]:,} (several times "
                              f"the largest model's), got {number:,}", EXAMPLE)
        values[KEYS[key]] = number
    if "hidden_size" in values:
        values.setdefault("ffn_size", 4 * values["hidden_size"])
    missing = [k for k, f in KEYS.items() if f not in values]
    if missing:
        raise OptionError(option, f"the shape lacks {', '.join(missing)}", EXAMPLE)
    if values["hidden_size"] % values["heads"]:
        raise OptionError(option, f"heads={values['heads']} do not divide "
                          f"hidden={values['hidden_size']}", EXAMPLE)
    return ModelSpec(name="custom", **values)


def model_text(spec: ModelSpec) -> str:
    """What --model would take to name `spec` again (a preset's name, or its shape)."""
    if PRESETS.get(spec.name) == spec:
        return spec.name
    return ",".join(f"{k}={getattr(spec, f)}" for k, f in KEYS.items())

