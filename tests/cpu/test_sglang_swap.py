"""sparse_mla.integrations.sglang: the swap of sglang's function, against a stand-in module at sglang's
path with sglang 0.5.23's signature (the decorator keeps ``__wrapped__``, as sglang's does)."""

from __future__ import annotations

import functools
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Optional

import pytest

import sparse_mla
from sparse_mla.integrations import sglang as swap


def _logged(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return wrapper


@_logged
def sglang_0_5_23(q, kv, indices, sm_scale: float, q_scale, kv_scale, d_v: int = 512,
                  attn_sink: Optional[object] = None, topk_length: Optional[object] = None, *,
                  out=None, max_logits=None, lse=None):
    return "sglang"


def sglang_without_topk_length(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None, *,
                               out=None, max_logits=None, lse=None):
    return "sglang"


def sglang_with_other_order(q, kv, indices, q_scale, kv_scale, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                            *, out=None, max_logits=None, lse=None):
    return "sglang"


def sglang_with_other_default(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=576, attn_sink=None, topk_length=None,
                              *, out=None, max_logits=None, lse=None):
    return "sglang"


def sglang_with_positional_outputs(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None,
                                   topk_length=None, out=None, max_logits=None, lse=None):
    return "sglang"


@pytest.fixture
def sglang_module(monkeypatch):
    """A stand-in for sglang's kernel module, at its import path, for one test."""
    module = types.ModuleType(swap.MODULE)
    monkeypatch.setitem(sys.modules, swap.MODULE, module)
    yield module
    swap.uninstall()


def test_install_sends_the_module_s_callers_to_sparse_mla_and_uninstall_restores(sglang_module):
    sglang_module.sparse_mla_q8kv8_prefill_fwd = sglang_0_5_23
    assert swap.install() is sglang_0_5_23 and swap.installed()
    # What dsa_backend.py does at each call: import the name from the module.
    from sglang.kernels.ops.attention.sparse_mla_q8kv8_prefill_sm90 import sparse_mla_q8kv8_prefill_fwd

    assert sparse_mla_q8kv8_prefill_fwd is sparse_mla.sparse_mla_q8kv8_prefill_fwd
    assert swap.install() is sglang_0_5_23, "a second install must change nothing"
    swap.uninstall()
    assert sglang_module.sparse_mla_q8kv8_prefill_fwd is sglang_0_5_23 and not swap.installed()


@pytest.mark.parametrize("function, differing", [
    (sglang_without_topk_length, "attn_sink=None, out=None (keyword-only)"),
    (sglang_with_other_order, "q_scale, kv_scale, sm_scale"),
    (sglang_with_other_default, "d_v=576"),
    (sglang_with_positional_outputs, "topk_length=None, out=None, max_logits=None"),
], ids=["missing-parameter", "other-order", "other-default", "outputs-not-keyword-only"])
def test_an_sglang_with_another_signature_is_refused_and_left_alone(sglang_module, function, differing):
    sglang_module.sparse_mla_q8kv8_prefill_fwd = function
    with pytest.raises(swap.SglangMismatchError, match=rf"takes \(.*{re.escape(differing)}.*\), not \(.*\) as in sglang 0\.5\.23"):
        swap.install()
    assert sglang_module.sparse_mla_q8kv8_prefill_fwd is function and not swap.installed()


def test_an_sglang_without_the_function_or_the_module_is_refused(sglang_module, monkeypatch):
    with pytest.raises(swap.SglangMismatchError, match="has no sparse_mla_q8kv8_prefill_fwd"):
        swap.install()
    monkeypatch.setitem(sys.modules, swap.MODULE, None)  # what an import of a missing module finds
    with pytest.raises(swap.SglangMismatchError, match=f"cannot import {swap.MODULE}"):
        swap.install()


def test_sparse_mla_takes_every_argument_sglang_s_callers_pass():
    """Ours has sglang's parameters, in order, with their kinds and sglang's defaults (where sglang has
    none, ours may have one: a call must pass the argument either way); anything it adds is a
    keyword-only parameter with a default, which sglang's callers never pass."""
    ours = swap.parameters(sparse_mla.sparse_mla_q8kv8_prefill_fwd)
    for (name, kind, default), theirs in zip(ours, swap.SGLANG_PARAMETERS, strict=False):
        assert (name, kind) == theirs[:2]
        assert theirs[2] is inspect.Parameter.empty or default == theirs[2], name
    for name, kind, default in ours[len(swap.SGLANG_PARAMETERS):]:
        assert kind == inspect.Parameter.KEYWORD_ONLY and default is not inspect.Parameter.empty, name
    assert swap.parameters(sglang_0_5_23) == swap.SGLANG_PARAMETERS


def test_the_serving_guide_names_the_module_the_function_and_the_helper():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    assert f"`{swap.MODULE}`" in guide.replace("\n", " ") and f"`{swap.FUNCTION}`" in guide
    assert "sparse_mla.integrations.sglang.install()" in guide and "`flashmla_sparse_q8`" in guide
