"""The one model configuration type, published configurations, and accelerators.

`Config` describes a Llama-style decoder. The same type runs a model (kvlesson.model.forward needs D, hidden
and vocab) and prices one (kvlesson.costs.memory needs n_layers, Hkv, d and a parameter count), so a published
model whose weights we never run, such as a mixture of experts, is a Config with the pricing fields only.

Each entry of MODELS names its public source in a comment and in its `source` field. Parameter counts of the
dense models are not typed in: they are counted from the tensor shapes their config.json implies (see
`Config.params`), and the comment gives the rounded figure the model page publishes, so the two can be compared.
"""
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class Config:
    n_layers: int  # transformer blocks, each with its own K and V
    H: int  # query heads
    Hkv: int  # KV heads: what the cache stores (H % Hkv == 0)
    d: int  # head dim, set on its own in some configs (head_dim), else D // H
    D: int | None = None  # model width (hidden_size); needed to run the model
    hidden: int | None = None  # SwiGLU inner width (intermediate_size)
    vocab: int | None = None  # vocabulary size
    tied: bool = False  # the output layer reuses the token embedding
    qkv_bias: bool = False  # biases on the q, k and v projections (counted, not run)
    rope_base: float = 10000.0  # RoPE base frequency (rope_theta)
    rope_interleaved: bool = False  # pairs (2m, 2m+1) as in GGUF, or (m, m + d/2) as in Hugging Face
    norm_eps: float = 1e-5  # RMSNorm epsilon
    max_len: int = 2048  # positions a StaticKVCache preallocates (the context the model was trained for)
    window: int | None = None  # sliding-window length on the windowed layers, if any
    window_layers: int = 0  # how many of the n_layers use that window
    total_params: float | None = None  # set where the shape cannot tell (mixture of experts); else counted
    active_params: float | None = None  # mixture of experts: parameters one token reads (None: all of them)
    experts: int | None = None  # mixture of experts: routed experts in each layer (num_local_experts)
    experts_per_token: int | None = None  # experts the router picks for each token, per layer (num_experts_per_tok)
    expert_params: float | None = None  # parameters of all routed experts, every layer: what the routing picks from
    name: str = ""
    source: str = ""  # where the numbers come from

    @property
    def params(self):
        """Parameters: total_params where given, else counted from the shapes of a dense decoder.

        Per layer: Wq [D, H*d], Wk and Wv [D, Hkv*d], Wo [H*d, D], three SwiGLU matrices [D, hidden], two norms
        [D], and q/k/v biases if any. Plus the token embedding [vocab, D], an output matrix of the same size
        unless tied, and a final norm.
        """
        if self.total_params is not None:
            return self.total_params
        if None in (self.D, self.hidden, self.vocab):
            raise ValueError(f"{self.name or 'this config'}: give D, hidden and vocab, or total_params")
        D, H, Hkv, d = self.D, self.H, self.Hkv, self.d
        attn = D * H * d + 2 * D * Hkv * d + H * d * D + ((H + 2 * Hkv) * d if self.qkv_bias else 0)
        layer = attn + 3 * D * self.hidden + 2 * D
        return self.n_layers * layer + self.vocab * D * (1 if self.tied else 2) + D


class ModelLike(Protocol):
    """What the engines and speculative decoding need of a model: kvlesson.llama.Model, or a tiny one made of
    kvlesson.model.tiny_config and random_weights (a SimpleNamespace with these two attributes does)."""

    config: Config
    weights: dict


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str
    memory: float  # bytes of device memory as the vendor states it ("80GB" read as 80e9 B)
    bandwidth: float  # peak memory bandwidth, bytes per second
    bf16_flops: float | None = None  # dense BF16 matrix throughput, FLOP/s, where the vendor publishes it
    source: str = ""


_HF = "https://huggingface.co/"

MODELS = {
    # Meta, config.json at huggingface.co/meta-llama/Llama-3.1-8B: hidden_size 4096, num_hidden_layers 32,
    # num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size 14336, vocab 128256, untied.
    # Counted: 8,030,261,248 parameters; the model page shows 8.03B.
    "Llama 3.1 8B": Config(name="Llama 3.1 8B", vocab=128256, D=4096, n_layers=32, H=32, Hkv=8, d=128, hidden=14336,
                           source=_HF + "meta-llama/Llama-3.1-8B/blob/main/config.json"),
    # Meta, config.json at huggingface.co/meta-llama/Llama-3.1-70B: hidden_size 8192, 80 layers, 64 heads,
    # 8 KV heads (head_dim 8192 / 64 = 128), intermediate_size 28672, untied. Counted: 70.55e9; the page shows 70.6B.
    "Llama 3.1 70B": Config(name="Llama 3.1 70B", vocab=128256, D=8192, n_layers=80, H=64, Hkv=8, d=128, hidden=28672,
                            source=_HF + "meta-llama/Llama-3.1-70B/blob/main/config.json"),
    # Meta, config.json at huggingface.co/meta-llama/Llama-3.1-405B: hidden_size 16384, 126 layers, 128 heads,
    # 8 KV heads, head_dim 128, intermediate_size 53248. Early copies of this config said 16 KV heads; the current
    # file and the Llama 3 paper (arXiv 2407.21783, Table 3) say 8. Counted: 405.85e9 parameters.
    "Llama 3.1 405B": Config(name="Llama 3.1 405B", vocab=128256, D=16384, n_layers=126, H=128, Hkv=8, d=128,
                             hidden=53248,
                             source=_HF + "meta-llama/Llama-3.1-405B/blob/main/config.json"),
    # Meta, config.json at huggingface.co/meta-llama/Llama-2-7b-hf: 32 layers, 32 heads, num_key_value_heads 32
    # (plain multi-head attention), hidden 4096, intermediate 11008, vocab 32000. Counted: 6.74e9, as published.
    "Llama 2 7B": Config(name="Llama 2 7B", vocab=32000, D=4096, n_layers=32, H=32, Hkv=32, d=128, hidden=11008,
                         source=_HF + "meta-llama/Llama-2-7b-hf/blob/main/config.json"),
    # Mistral AI, config.json at huggingface.co/mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads,
    # hidden 4096, intermediate 14336, vocab 32000, sliding_window 4096 on every layer (the paper, arXiv
    # 2310.06825, calls its cache a rolling buffer of W = 4096). Counted: 7.24e9; the page shows 7.24B.
    "Mistral 7B v0.1": Config(name="Mistral 7B v0.1", vocab=32000, D=4096, n_layers=32, H=32, Hkv=8, d=128,
                              hidden=14336,
                              window=4096, window_layers=32,
                              source=_HF + "mistralai/Mistral-7B-v0.1/blob/main/config.json"),
    # Qwen, config.json at huggingface.co/Qwen/Qwen2.5-7B: hidden_size 3584, 28 layers, 28 heads, 4 KV heads
    # (head_dim 128), intermediate 18944, vocab 152064, biases on q, k, v, use_sliding_window false.
    # Counted: 7,615,616,512; the model card lists 7.61B (6.53B without embeddings).
    "Qwen2.5-7B": Config(name="Qwen2.5-7B", vocab=152064, D=3584, n_layers=28, H=28, Hkv=4, d=128, hidden=18944,
                         qkv_bias=True, source=_HF + "Qwen/Qwen2.5-7B/blob/main/config.json"),
    # OpenAI, config.json at huggingface.co/openai/gpt-oss-120b: 36 layers, 64 heads, 8 KV heads, head_dim 64,
    # sliding_window 128, layer_types alternating sliding_attention / full_attention (18 of each). A mixture of
    # experts: the model card (arXiv 2508.10925) gives 116.8B parameters in total, 5.1B active per token.
    # num_local_experts 128 and num_experts_per_tok 4 in every layer. The experts' parameters are counted from the
    # shapes transformers' GptOssExperts gives this config (hidden_size 2880, intermediate_size 2880): per expert
    # gate_up_proj [2880, 2 x 2880] with its bias and down_proj [2880, 2880] with its bias, 24,891,840 parameters,
    # x 128 experts x 36 layers = 114.70e9. The 5.1B active less 4 experts' share leaves 1.52e9 that every token
    # reads (attention, routers, norms, the output matrix); the 116.8B total less the experts leaves 2.10e9: those
    # and 0.58e9 more, the 201,088 x 2880 token table, of which a token reads one row.
    "gpt-oss-120b": Config(name="gpt-oss-120b", n_layers=36, H=64, Hkv=8, d=64, total_params=116.8e9,
                           window=128, window_layers=18, active_params=5.1e9, experts=128, experts_per_token=4,
                           expert_params=36 * 128 * (2880 * 2 * 2880 + 2 * 2880 + 2880 * 2880 + 2880),
                           source=_HF + "openai/gpt-oss-120b/blob/main/config.json"),
    # Qwen, config.json at huggingface.co/Qwen/Qwen3-32B: hidden_size 5120, 64 layers, num_attention_heads 64,
    # num_key_value_heads 8, head_dim 128 set on its own (5120 / 64 would be 80: the query projection is wider
    # than the model, 64 x 128 = 8192), intermediate_size 25600, vocab 151936, untied, no attention biases.
    # Its per-head q/k RMSNorm weights (2 x 128 per layer) are not counted. Counted: 32,762,106,880; the model
    # card lists 32.8B (31.2B without embeddings; counted here: 31.21e9).
    "Qwen3-32B": Config(name="Qwen3-32B", vocab=151936, D=5120, n_layers=64, H=64, Hkv=8, d=128, hidden=25600,
                        rope_base=1e6, source=_HF + "Qwen/Qwen3-32B/blob/main/config.json"),
    # Hugging Face, config.json at huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, 9 heads,
    # 3 KV heads, head_dim 64, hidden 576, intermediate 1536, vocab 49152, tied embeddings. Counted: 134,515,008.
    "SmolLM2-135M": Config(name="SmolLM2-135M", vocab=49152, D=576, n_layers=30, H=9, Hkv=3, d=64, hidden=1536,
                           tied=True,
                           source=_HF + "HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json"),
}


# Published sizes of whole checkpoints, in bytes, where the parameter count times one dtype would mislead:
# mixed-precision files. name -> (bytes, source).
CHECKPOINT_BYTES = {
    # OpenAI, gpt-oss-120b & gpt-oss-20b model card (arXiv 2508.10925), Table 1: checkpoint size 60.8 GiB. The
    # MoE expert weights are stored in MXFP4 (4-bit values with a shared scale per 32: 4.25 bits each), attention,
    # router and embeddings in bf16, which is why 116.8B x 4 bits (58.4 GB) underestimates the file.
    "gpt-oss-120b": (60.8 * 2 ** 30, "gpt-oss-120b & gpt-oss-20b model card, arXiv 2508.10925, Table 1"),
}


ACCELERATORS = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM column: 80GB HBM3, 3.35TB/s; BF16 Tensor Core 1,979 TFLOPS
    # with 2:4 sparsity, so 989.5 TFLOPS dense.
    "H100 SXM": Accelerator(name="H100 SXM", memory=80e9, bandwidth=3.35e12, bf16_flops=1979e12 / 2,
                            source="https://www.nvidia.com/en-us/data-center/h100/ (datasheet)"),
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: 80GB HBM2e, 2,039GB/s; BF16 Tensor Core
    # 312 TFLOPS dense (624 with sparsity).
    "A100 80GB SXM": Accelerator(name="A100 80GB SXM", memory=80e9, bandwidth=2039e9, bf16_flops=312e12,
                                 source="https://www.nvidia.com/en-us/data-center/a100/ (datasheet)"),
    # NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X on a 384-bit bus at 21 Gbps per pin,
    # so 384 / 8 B x 21e9 /s = 1,008 GB/s, the peak bandwidth the whitepaper lists.
    "RTX 4090": Accelerator(name="RTX 4090", memory=24e9, bandwidth=384 // 8 * 21e9,
                            source="NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090)"),
    # Apple newsroom, 30 Oct 2024 (MacBook Pro with M4 Max): up to 128GB unified memory, up to 546GB/s.
    # Unified memory is shared with the CPU and the OS, so not all of it is available to a model.
    "Apple M4 Max (128 GB)": Accelerator(name="Apple M4 Max (128 GB)", memory=128e9, bandwidth=546e9,
                                         source="Apple newsroom, 30 Oct 2024 (MacBook Pro with M4 Pro and M4 Max)"),
}
