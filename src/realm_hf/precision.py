"""Training and embedding precision: bf16 mixed precision where the hardware runs it natively, fp32 otherwise.

`"auto"` (the default of `realm-hf train`, `pretrain`, ICT and index builds) picks bf16 when the device computes in
bf16 natively and fp32 elsewhere:

- CPU: bf16 when the processor has AVX512-BF16 or AMX-BF16 (the `avx512_bf16` / `amx_bf16` flags of /proc/cpuinfo
  on Linux, or `torch.backends.cpu.get_cpu_capability()` naming AMX or BF16). Without them torch emulates bf16
  matrix products, which is slower than fp32, so "auto" stays fp32.
- CUDA: bf16 when `torch.cuda.is_bf16_supported()` (Ampere and newer).

bf16 here is mixed precision: weights, optimizer state and gradients stay fp32 (the master weights), matrix products
run in bf16 under `torch.autocast`, and autocast keeps softmax, log-softmax, logsumexp, layer norm and the losses in
fp32. `"fp32"` turns it off; `"bf16"` asks for it even where it is emulated (slow, for testing).
"""

import contextlib
import functools
import os

# torch and transformers are imported inside the functions: the CLI adds these flags before it imports them.
PRECISIONS = ("auto", "bf16", "fp32")
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None, capability: str | None = None) -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX-BF16).

    `flags` (/proc/cpuinfo flags) and `capability` (`torch.backends.cpu.get_cpu_capability()`) default to this
    machine's; either one naming the feature is enough."""
    flags = cpu_flags() if flags is None else flags
    if any(flag in flags for flag in _CPU_BF16_FLAGS):
        return True
    if capability is None:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    return "AMX" in capability.upper() or "BF16" in capability.upper()


def native_bf16(device="cpu") -> bool:
    """Whether `device` computes in bf16 natively (see the module docstring)."""
    import torch

    device_type = torch.device(device).type
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return cpu_has_native_bf16()
    return False


def resolve_precision(precision: str | None = "auto", device="cpu") -> str:
    """`"bf16"` or `"fp32"` for `precision` (`"auto"`, `"bf16"`, `"fp32"`; `None` means `"auto"`) on `device`.

    The environment variable `REALM_HF_PRECISION` overrides `"auto"` (e.g. to force fp32 on a whole run)."""
    precision = "auto" if precision is None else precision
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; received {precision!r}.")
    if precision == "auto":
        forced = os.environ.get("REALM_HF_PRECISION", "").strip().lower()
        if forced:
            if forced not in ("bf16", "fp32"):
                raise ValueError(f"REALM_HF_PRECISION must be bf16 or fp32; received {forced!r}.")
            return forced
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        import torch
        from transformers.utils import logging

        logging.get_logger(__name__).warning(
            "bf16 was asked for on %s, which has no native bf16: it is emulated and slower than fp32.",
            torch.device(device).type,
        )  # fmt: skip
    return precision


def autocast(precision: str, device="cpu"):
    """A context that runs under bf16 autocast on `device`'s type when `precision` resolves to bf16, else nothing."""
    import torch

    device_type = torch.device(device).type
    if precision not in ("bf16", "fp32"):
        precision = resolve_precision(precision, device)  # "auto" (or an error); an explicit choice warns once, there
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def add_precision_argument(parser, what: str = "training") -> None:
    """`--precision {auto,bf16,fp32}` (default auto) and `--fp32` (the same as `--precision fp32`) on an argparse
    parser; read the choice back with [`precision_from_args`]."""
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help=f"{what} precision: bf16 mixed precision (fp32 weights), fp32, or auto (default): bf16 "
                        "where the CPU has AVX512-BF16/AMX or the GPU supports bf16, fp32 elsewhere")  # fmt: skip
    parser.add_argument("--fp32", action="store_true", help="the same as --precision fp32")


def precision_from_args(args) -> str:
    """The precision asked for by [`add_precision_argument`]'s flags (`"auto"`, `"bf16"` or `"fp32"`)."""
    if getattr(args, "fp32", False):
        if getattr(args, "precision", "auto") == "bf16":
            raise ValueError("--fp32 and --precision bf16 contradict each other; pass one of them.")
        return "fp32"
    return getattr(args, "precision", "auto")


def compute_in_float32(module):
    """fp32 arithmetic over half-precision stored weights, for a module whose output decides something sharp (the
    question embedding decides which blocks are retrieved): every `nn.Linear` and `nn.LayerNorm` under `module`
    computes in fp32 with its weights upcast at each call (one layer's copy at a time, so memory stays that of the
    stored weights), and every `nn.Embedding` returns its rows in fp32. Parameters, `state_dict` and saving are
    untouched. Idempotent; returns `module`.

    At 13.35M blocks with bf16 weights (benchmarks/load_memory.py), bf16 arithmetic in the question encoder found 95%
    of the fp32 model's top-5 blocks; fp32 arithmetic over the same bf16 weights 98%."""
    import torch
    from torch import nn
    from torch.nn import functional

    def linear(layer, hidden_states):
        bias = None if layer.bias is None else layer.bias.float()
        return functional.linear(hidden_states.float(), layer.weight.float(), bias)

    def layer_norm(layer, hidden_states):
        weight = None if layer.weight is None else layer.weight.float()
        bias = None if layer.bias is None else layer.bias.float()
        return functional.layer_norm(hidden_states.float(), layer.normalized_shape, weight, bias, layer.eps)

    for layer in module.modules():
        if getattr(layer, "_realm_hf_float32_compute", False):
            continue
        if isinstance(layer, nn.Linear):
            layer.forward = functools.partial(linear, layer)
        elif isinstance(layer, nn.LayerNorm):
            layer.forward = functools.partial(layer_norm, layer)
        elif isinstance(layer, nn.Embedding):
            layer.register_forward_hook(lambda _layer, _inputs, output: output.to(torch.float32))
        else:
            continue
        layer._realm_hf_float32_compute = True
    return module
