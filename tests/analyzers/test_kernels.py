"""Kernel classification table: one test per row, and agreement with HTA's rules."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from pardiag.analyzers.kernels import (
    HTA_RULES,
    RULES,
    KernelKind,
    KernelRule,
    classify,
    classify_names,
    event_kinds,
)


@pytest.fixture(scope="module")
def hta_utils() -> ModuleType:
    return pytest.importorskip("hta.utils.utils", reason="HolisticTraceAnalysis not installed")


@pytest.mark.parametrize("rule", RULES, ids=[r.source for r in RULES])
def test_row_classifies_its_examples(rule: KernelRule) -> None:
    assert rule.examples, "every row names the kernels it is for"
    for name in rule.examples:
        assert rule.pattern.match(name), name
        assert classify(name) is rule.kind, name


@pytest.mark.parametrize("rule", RULES, ids=[r.source for r in RULES])
def test_row_agrees_with_hta_when_marked(rule: KernelRule, hta_utils: ModuleType) -> None:
    """Rows marked ``hta`` classify as HTA 0.5 does; the others exist because HTA
    gets those names wrong (it calls them compute)."""
    for name in rule.examples:
        hta_kind = hta_utils.get_kernel_type(name)
        if rule.hta:
            assert hta_kind == rule.kind.name, name
            assert classify(name, HTA_RULES) is rule.kind
        else:
            assert hta_kind != rule.kind.name, name


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >",
         KernelKind.COMPUTATION),
        ("ampere_sgemm_128x64_tn", KernelKind.COMPUTATION),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", KernelKind.COMMUNICATION),
        ("Memset (Device)", KernelKind.MEMORY),
        ("Memcpy DtoD (Device -> Device)", KernelKind.MEMORY),
        ("Context Sync", KernelKind.OTHER),
        ("", KernelKind.COMPUTATION),
    ],
)
def test_common_names(name: str, kind: KernelKind, hta_utils: ModuleType) -> None:
    assert classify(name) is kind
    assert hta_utils.get_kernel_type(name) == kind.name


def test_kind_codes_match_hta(hta_utils: ModuleType) -> None:
    for kind in KernelKind:
        assert hta_utils.KernelType[kind.name].value == kind.value


def test_classify_names_returns_codes() -> None:
    codes = classify_names(["ncclKernel_x", "gemm", "Memcpy HtoD"])
    assert codes.dtype == np.int8
    assert codes.tolist() == [KernelKind.COMMUNICATION, KernelKind.COMPUTATION, KernelKind.MEMORY]


def test_event_kinds_classifies_each_name_once_and_uses_categories() -> None:
    names = ["gemm", "ncclDevKernel_AllReduce", "CopyDeviceToHost", "unused"]
    cats = ["kernel", "gpu_memcpy"]
    name_id = np.array([0, 1, 2, 0, 1], dtype=np.int32)
    cat_id = np.array([0, 0, 1, 0, 0], dtype=np.int32)
    kinds = event_kinds(name_id, cat_id, names, cats)
    assert kinds.tolist() == [2, 0, 1, 2, 0]  # the AMD-named copy is memory by category
    by_name = event_kinds(name_id, cat_id, names, cats, memory_by_category=False)
    assert by_name[2] == KernelKind.COMPUTATION
