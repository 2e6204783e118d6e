"""The models `distbench step` trains and `distbench plan` plans for, torch-free: a stack of
`layers` transformer layers, each an attention block then an MLP block (both residual, no bias
and no norm, as steps.mesh_model builds them), trained on `batch` samples of `seq_len` tokens per
step; with a vocabulary, an embedding before the stack and an LM head after it (untied, as
Llama's). Presets name common sizes; an explicit shape names every field.

The facts every count derives from live here, once: a layer's parameters (`attention_params`,
`mlp_params`), the vocabulary's (`vocab_params`) and the FLOPs of a layer and of the LM head.
Attention may group its keys and values (`kv_heads` under `heads`: grouped-query attention);
the MLP may be gated (SwiGLU: gate, up and down, Llama's). The Llama-2 presets hold the
published parameter counts to within 0.1% (norms, a few hidden-size vectors per layer, are
left out); `1b` is a plain GPT-style shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from distbench.core.options import OptionError
from distbench.core.transformer import (
    attention_params,
    mlp_params,
    unfused_score_bytes_moved,
    vocab_params,
)

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
    kv_heads: int = 0  # grouped-query attention's key/value heads; 0: as many as `heads`
    vocab: int = 0  # 0: no embedding and no LM head (the samples are hidden-size vectors)
    gated: bool = False  # SwiGLU's gate beside up and down
    # attention as a fused kernel (torch's scaled_dot_product_attention, what `step` runs), or
    # unfused, its a x s scores written to memory (Megatron-LM before FlashAttention)
    fused_attention: bool = True

    def __post_init__(self):
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)

    @property
    def params_per_layer(self) -> int:
        return (attention_params(self.hidden_size, self.heads, self.kv_heads)
                + mlp_params(self.hidden_size, self.ffn_size, self.gated))

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + vocab_params(self.hidden_size, self.vocab)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def layer_shape(self) -> dict:
        """What a layer's time depends on: a layer timed on a model of the same shape is this
        model's layer."""
        return {k: getattr(self, k) for k in LAYER_KEYS}

    def flops_per_layer(self, tokens: int, tp: int = 1) -> float:
        """Forward plus backward of one layer on `tokens` tokens, one TP shard of it: 6 FLOPs
        per parameter and token for the matmuls, and the attention's scores and weighted sum
        (2 matmuls of seq x seq x hidden per sample, 3x for forward and backward)."""
        dense = 6 * tokens * self.params_per_layer
        return (dense + attention_core_flops(self, tokens, backward=True)) / tp

    def score_bytes(self, tokens: int, tp: int, elt_bytes: int) -> float:
        """What unfused attention reads and writes of its scores in one forward and backward
        on `tokens` tokens, one TP shard (heads / tp) of it; 0 fused. Memory-bound work, which
        no FLOP count holds."""
        if self.fused_attention:
            return 0.0
        return (tokens * self.heads / tp * self.seq_len
                * unfused_score_bytes_moved(elt_bytes))

    def head_flops(self, tokens: int, tp: int = 1) -> float:
        """The LM head's forward and backward on `tokens` tokens (one TP shard of the
        vocabulary); the embedding is a lookup."""
        return 6 * tokens * self.vocab * self.hidden_size / tp

    def describe(self) -> str:
        extra = "".join([f", kv heads {self.kv_heads}" if self.kv_heads != self.heads else "",
                         ", gated" if self.gated else "",
                         "" if self.fused_attention else ", unfused attention",
                         f", vocab {self.vocab}" if self.vocab else ""])
        count = (f"{self.params / 1e9:.3g}B" if self.params >= 1e8 else f"{self.params:,}")
        return (f"{self.name}: {self.layers} layers, hidden {self.hidden_size}, ffn "
                f"{self.ffn_size}, heads {self.heads}{extra}, seq {self.seq_len}, batch "
                f"{self.batch} ({count} parameters)")

    def to_json(self) -> dict:
        return asdict(self)


# what a layer's time depends on (ModelSpec.layer_shape), and the value a record that predates
# a key implies
LAYER_KEYS = ("hidden_size", "ffn_size", "heads", "seq_len", "kv_heads", "gated",
              "fused_attention")


def same_layer(shape: dict | None, model: ModelSpec) -> bool:
    """Whether a recorded layer shape is `model`'s (a record without kv_heads or gated had
    neither: every head its own keys, no gate)."""
    if shape is None:
        return False
    implied = {"kv_heads": shape.get("heads"), "gated": False, "fused_attention": True}
    return all(shape.get(k, implied.get(k)) == getattr(model, k) for k in LAYER_KEYS)


def attention_core_flops(model: ModelSpec, tokens: int, backward: bool) -> float:
    """The scores and the weighted sum, 2 matmuls of 2 x seq x hidden FLOPs per token, forward
    (backward: twice that again), whole (divide by tp for a shard)."""
    forward = 2 * 2 * tokens * model.seq_len * model.hidden_size
    return 3 * forward if backward else forward


LLAMA2_VOCAB = 32000
PRESETS: dict[str, ModelSpec] = {m.name: m for m in (
    # small enough for 4 gloo workers on 2 cores: a step of tens of ms
    ModelSpec(name="toy", layers=4, hidden_size=128, ffn_size=512, heads=4, seq_len=32,
              batch=16),
    ModelSpec(name="1b", layers=24, hidden_size=2048, ffn_size=8192, heads=16, seq_len=2048,
              batch=512),
    # Llama 2 (Touvron et al. 2023, table 1 and the released configs): 6.74B, 13.0B, 69.0B
    ModelSpec(name="7b", layers=32, hidden_size=4096, ffn_size=11008, heads=32, seq_len=4096,
              batch=1024, vocab=LLAMA2_VOCAB, gated=True),
    ModelSpec(name="13b", layers=40, hidden_size=5120, ffn_size=13824, heads=40, seq_len=4096,
              batch=1024, vocab=LLAMA2_VOCAB, gated=True),
    ModelSpec(name="70b", layers=80, hidden_size=8192, ffn_size=28672, heads=64, kv_heads=8,
              seq_len=4096, batch=1024, vocab=LLAMA2_VOCAB, gated=True),
)}

# explicit shape keys -> ModelSpec fields
KEYS = {"layers": "layers", "hidden": "hidden_size", "ffn": "ffn_size", "heads": "heads",
        "seq": "seq_len", "batch": "batch", "kv_heads": "kv_heads", "vocab": "vocab",
        "gated": "gated", "attention": "fused_attention"}
# the keys a shape may leave out, and what leaving them out means
OPTIONAL = {"kv_heads": 0, "vocab": 0, "gated": 0, "attention": "fused"}
# attention=: a word, not a number. fused: torch's scaled_dot_product_attention, what `step`
# runs; unfused: its a x s scores written to memory (Megatron-LM before FlashAttention)
ATTENTION = {"fused": True, "unfused": False}
# A shape's keys for --help: space-separated, so the help wraps them at 80 columns instead of
# cutting one long word (the examples under --help show them comma-joined)
SHAPE_HELP = (" ".join(f"{k}=" for k in KEYS if k not in OPTIONAL) + ", comma-joined (and "
              "optionally kv_heads=, vocab=, gated=1, attention=unfused; ffn defaults to 4 x "
              "hidden)")

# The most a shape may say of each key. A plan's and a step's layouts are arithmetic over the
# layers' and the batch's divisors, and a number with no bound made that arithmetic run for
# minutes (layers=10^9, batch=10^12; issue 30). Each bound is many times the largest public
# model's figure, so no real model is refused: 126 layers (Llama 3.1 405B; PaLM 118, GPT-3
# 96); hidden 20,480 (MT-NLG 530B; Llama 3.1 405B 16,384); ffn 73,728 (PaLM 540B; Llama 3.1
# 405B 53,248), and 4 x 2^20, the default for the largest hidden, is allowed; 128 heads;
# contexts of about a million tokens (10M claimed for Llama 4 Scout); global batches of a few
# million tokens (16M for Llama 3.1 405B: 2,048 samples of 8,192), so 2^24 samples even of one
# token each; a vocabulary of 2^20 (Gemma's 256k, BLOOM's 250k). Within these the largest plan
# is seconds (docs/plan.md gives the figures).
MAX_SHAPE = {"layers": 1024, "hidden": 2**20, "ffn": 2**22, "heads": 2**16, "seq": 2**24,
             "batch": 2**24, "kv_heads": 2**16, "vocab": 2**20, "gated": 1}


def parse_model(option: str, text) -> ModelSpec:
    """A preset's name, or an explicit shape `layers=4,hidden=128,ffn=512,heads=4,seq=32,
    batch=16` (every key but those OPTIONAL; ffn defaults to 4 x hidden), with kv_heads=,
    vocab=, gated=1 and attention=unfused where wanted. Raises OptionError."""
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
        if KEYS[key] in values:  # the last one winning hid the mistake
            raise OptionError(option, f"{key} is given twice", EXAMPLE)
        if key == "attention":
            if value.strip() not in ATTENTION:
                raise OptionError(option, f"attention={value.strip()!r} is not one of "
                                  f"{', '.join(ATTENTION)}", EXAMPLE)
            values[KEYS[key]] = ATTENTION[value.strip()]
            continue
        try:  # int() takes any script's digits: 'layers=８' was 8 layers
            number = int(value.strip()) if value.isascii() else None
        except ValueError:
            number = None
        if number is None:
            raise OptionError(option, f"{key}={value.strip()!r} is not a whole number"
                              + ("" if value.isascii() else " in ASCII digits"), EXAMPLE)
        # kv_heads=0 was taken as leaving it out, silently: it is as many as heads only unsaid
        low = 0 if key in OPTIONAL and key != "kv_heads" else 1
        if number < low:
            raise OptionError(option, f"{key} must be at least {low}, got {number}"
                              + (" (leave kv_heads out for as many as heads)"
                                 if key == "kv_heads" else ""), EXAMPLE)
        if number > MAX_SHAPE[key]:
            raise OptionError(option, f"{key} must be at most {MAX_SHAPE[key]:,} (several times "
                              f"the largest model's), got {number:,}", EXAMPLE)
        values[KEYS[key]] = number
    if "hidden_size" in values:
        values.setdefault("ffn_size", 4 * values["hidden_size"])
    missing = [k for k, f in KEYS.items() if f not in values and k not in OPTIONAL]
    if missing:
        raise OptionError(option, f"the shape lacks {', '.join(missing)}", EXAMPLE)
    if values["hidden_size"] % values["heads"]:
        raise OptionError(option, f"heads={values['heads']} do not divide "
                          f"hidden={values['hidden_size']}", EXAMPLE)
    kv = values.get("kv_heads") or values["heads"]
    if values["heads"] % kv:
        raise OptionError(option, f"kv_heads={kv} do not divide heads={values['heads']}",
                          EXAMPLE)
    if "gated" in values:
        values["gated"] = bool(values["gated"])
    return ModelSpec(name="custom", **values)


def model_text(spec: ModelSpec) -> str:
    """What --model would take to name `spec` again (a preset's name, or its shape)."""
    if PRESETS.get(spec.name) == spec:
        return spec.name
    implied = {"kv_heads": spec.heads, "vocab": 0, "gated": False, "attention": True}
    words = {"attention": {v: k for k, v in ATTENTION.items()}}
    return ",".join(f"{k}={words[k][getattr(spec, f)] if k in words else int(getattr(spec, f))}"
                    for k, f in KEYS.items()
                    if k not in OPTIONAL or getattr(spec, f) != implied[k])

