"""Put sparse_mla in place of sglang's SM90 Q8KV8 sparse prefill kernel.

sglang's ``flashmla_sparse_q8`` prefill backend (``sglang/srt/layers/attention/dsa_backend.py``, and
the DeepSeek-V4 backend beside it) calls ``sparse_mla_q8kv8_prefill_fwd`` of the module
``sglang.kernels.ops.attention.sparse_mla_q8kv8_prefill_sm90``, importing the name from that module
inside the function that calls it (sglang 0.5.23). Replacing the module's attribute therefore sends
every later call to sparse_mla, whose function takes the same arguments and returns the same tuple::

    import sparse_mla.integrations.sglang as swap

    swap.install()  # in the server process, before the first prefill (and before any graph capture)
    # ... serve; swap.uninstall() puts sglang's function back

:func:`install` refuses (``SglangMismatchError``) an sglang whose function has other parameters than
the ones this was written against, since a call through a changed signature would pass arguments to
the wrong places.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from sparse_mla.errors import SparseMLAError

MODULE = "sglang.kernels.ops.attention.sparse_mla_q8kv8_prefill_sm90"
FUNCTION = "sparse_mla_q8kv8_prefill_fwd"

_EMPTY = inspect.Parameter.empty
_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY

# sglang's parameters (name, kind, default), in order: what a caller of sglang's function may pass.
SGLANG_PARAMETERS: tuple[tuple[str, Any, Any], ...] = (
    ("q", _POSITIONAL, _EMPTY),
    ("kv", _POSITIONAL, _EMPTY),
    ("indices", _POSITIONAL, _EMPTY),
    ("sm_scale", _POSITIONAL, _EMPTY),
    ("q_scale", _POSITIONAL, _EMPTY),
    ("kv_scale", _POSITIONAL, _EMPTY),
    ("d_v", _POSITIONAL, 512),
    ("attn_sink", _POSITIONAL, None),
    ("topk_length", _POSITIONAL, None),
    ("out", _KEYWORD, None),
    ("max_logits", _KEYWORD, None),
    ("lse", _KEYWORD, None),
)


class SglangMismatchError(SparseMLAError):
    """The installed sglang has no such function, or one whose parameters differ from those expected."""


_lock = threading.Lock()
_replaced: dict[str, Callable[..., Any]] = {}  # FUNCTION -> sglang's own function, while installed


def parameters(function: Callable[..., Any]) -> tuple[tuple[str, Any, Any], ...]:
    """``function``'s parameters as (name, kind, default), through decorators that keep ``__wrapped__``."""
    return tuple((p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values())


def _describe(params: tuple[tuple[str, Any, Any], ...]) -> str:
    return ", ".join(name + ("" if default is _EMPTY else f"={default!r}") + (" (keyword-only)" if kind == _KEYWORD else "")
                     for name, kind, default in params)


def _sglang_module() -> Any:
    try:
        return importlib.import_module(MODULE)
    except ImportError as error:
        raise SglangMismatchError(
            f"cannot import {MODULE} ({error}): this needs an sglang that has it (0.5.23 does)"
        ) from error


def install() -> Callable[..., Any]:
    """Replace sglang's ``sparse_mla_q8kv8_prefill_fwd`` with sparse_mla's; returns sglang's function.

    Calling it again changes nothing. Raises SglangMismatchError when sglang lacks the module or the
    function, or when the function's parameters are not those of sglang 0.5.23 (names, order, kinds and
    defaults), naming both.
    """
    from sparse_mla.api import sparse_mla_q8kv8_prefill_fwd

    module = _sglang_module()
    with _lock:
        if FUNCTION in _replaced:
            return _replaced[FUNCTION]
        original = getattr(module, FUNCTION, None)
        if original is None:
            raise SglangMismatchError(f"{MODULE} has no {FUNCTION}: this sglang is not the one sparse_mla replaces")
        found = parameters(original)
        if found != SGLANG_PARAMETERS:
            raise SglangMismatchError(
                f"{MODULE}.{FUNCTION} takes ({_describe(found)}), not ({_describe(SGLANG_PARAMETERS)}) as in "
                f"sglang 0.5.23: its callers may pass arguments sparse_mla would take for others, so it is not replaced"
            )
        setattr(module, FUNCTION, sparse_mla_q8kv8_prefill_fwd)
        _replaced[FUNCTION] = original
        return original


def uninstall() -> None:
    """Put sglang's own function back (nothing to do when install was not called)."""
    with _lock:
        original = _replaced.pop(FUNCTION, None)
        if original is not None:
            setattr(_sglang_module(), FUNCTION, original)


def installed() -> bool:
    """Whether sglang's function is sparse_mla's now."""
    with _lock:
        return FUNCTION in _replaced
