"""The operations a server-side custom loss may use, by the name the SDK's graph gives them, with their arity.

Names only (no torch here: the ingress validates against this); app.training.custom_loss.interpreter binds each
name to its callable, and a unit test checks that every name binds. Arity is (fewest, most) positional
arguments, a method's tensor included. Nothing creates a tensor of a size the loss chooses (no zeros, arange,
repeat, expand): every intermediate stays the size of the inputs or a broadcast of them.
"""

from __future__ import annotations

_UNARY, _BINARY, _TERNARY = (1, 1), (2, 2), (3, 3)
_REDUCE = (1, 3)  # x, dim, keepdim
_ANY = (1, 8)

_ELEMENTWISE = [
    "abs",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "neg",
    "sqrt",
    "rsqrt",
    "square",
    "sign",
    "sigmoid",
    "tanh",
    "relu",
    "floor",
    "ceil",
    "round",
    "trunc",
    "isfinite",
    "isnan",
    "isinf",
    "logical_not",
    "reciprocal",
    "sin",
    "cos",
]
_BINARY_OPS = [
    "add",
    "sub",
    "mul",
    "div",
    "true_divide",
    "pow",
    "minimum",
    "maximum",
    "fmin",
    "fmax",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "remainder",
    "fmod",
    "atan2",
    "xlogy",
]
_REDUCTIONS = [
    "sum",
    "mean",
    "prod",
    "amax",
    "amin",
    "max",
    "min",
    "std",
    "var",
    "logsumexp",
    "all",
    "any",
    "argmax",
    "argmin",
    "norm",
]
_SHAPES = {
    "squeeze": (1, 2),
    "unsqueeze": _BINARY,
    "reshape": _ANY,
    "flatten": (1, 3),
    "transpose": _TERNARY,
    "movedim": _TERNARY,
    "gather": _TERNARY,
    "where": (1, 3),
    "clamp": (1, 3),
    "clip": (1, 3),
    "cumsum": _BINARY,
    "cumprod": _BINARY,
    "softmax": (1, 3),
    "log_softmax": (1, 3),
    "nan_to_num": (1, 4),
    "masked_fill": _TERNARY,
    "matmul": _BINARY,
    "dot": _BINARY,
    "outer": _BINARY,
    "diff": (1, 2),
    "sort": (1, 3),
    "topk": (2, 5),
}

FUNCTIONS: dict[str, tuple[int, int]] = {
    **{f"torch.{n}": _UNARY for n in _ELEMENTWISE},
    **{f"torch.{n}": _BINARY for n in _BINARY_OPS},
    **{f"torch.{n}": _REDUCE for n in _REDUCTIONS},
    **{f"torch.{n}": arity for n, arity in _SHAPES.items()},
    "torch.stack": (1, 2),
    "torch.cat": (1, 2),
    "torch.concat": (1, 2),
    "torch.einsum": (2, 8),
    "torch.zeros_like": _UNARY,
    "torch.ones_like": _UNARY,
    "torch.full_like": _BINARY,
    "torch.nn.functional.relu": (1, 2),
    "torch.nn.functional.sigmoid": _UNARY,
    "torch.nn.functional.silu": (1, 2),
    "torch.nn.functional.softmax": (1, 4),
    "torch.nn.functional.log_softmax": (1, 4),
    "torch.nn.functional.mse_loss": (2, 5),
    "torch.nn.functional.kl_div": (2, 6),
    "torch._C._nn.softplus": (1, 3),
    "torch._C._nn.log_sigmoid": _UNARY,
    "torch._C._special.special_expit": _UNARY,
    **{
        f"operator.{n}": _BINARY
        for n in ["add", "sub", "mul", "truediv", "floordiv", "pow", "mod", "matmul", "getitem"]
    },
    **{f"operator.{n}": _BINARY for n in ["lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "xor"]},
    **{f"operator.{n}": _UNARY for n in ["neg", "pos", "abs", "invert"]},
    **{f"math.{n}": _UNARY for n in ["sqrt", "log", "exp", "log1p", "expm1", "fabs", "floor", "ceil"]},
    "math.pow": _BINARY,
    "getattr": _BINARY,  # tensor attributes only: GETATTR_ATTRIBUTES
}

METHODS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(_ELEMENTWISE, _UNARY),
    **dict.fromkeys(_BINARY_OPS, _BINARY),
    **dict.fromkeys(_REDUCTIONS, _REDUCE),
    **_SHAPES,
    "view": _ANY,
    "permute": _ANY,
    "t": _UNARY,
    "size": (1, 2),
    "dim": _UNARY,
    "numel": _UNARY,
    "detach": _UNARY,
    "clone": _UNARY,
    "contiguous": _UNARY,
    "float": _UNARY,
    "double": _UNARY,
    "to": (1, 3),  # dtypes; a device always means the worker's own
    "type_as": _BINARY,
    "expand_as": _BINARY,
    "view_as": _BINARY,
    "reshape_as": _BINARY,
}

# Attributes a loss may read with getattr (fx records `x.shape` as getattr(x, "shape")).
GETATTR_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T", "mT"})

# Methods that leave torch for the host, or act on autograd or storage: named as such in errors.
HOST_METHODS = frozenset(
    [
        "item",
        "tolist",
        "numpy",
        "backward",
        "cpu",
        "cuda",
        "data_ptr",
        "storage",
        "untyped_storage",
        "register_hook",
        "retain_grad",
        "share_memory_",
        "pin_memory",
        "requires_grad_",
        "__setitem__",
    ]
)

DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"})
