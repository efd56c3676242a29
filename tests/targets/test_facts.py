"""Targets as microarchitecture facts: every entry complete and sane, the table agreeing with
LLVM's own CPU feature lists, host detection on this machine and on described machines, and
``targets`` standing on its own (nothing from ``dsl``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from targets import cpu

REQUIRED = ("znver3", "znver4", "znver5", "skylake-avx512", "icelake-server", "sapphirerapids",
            "x86-avx2", "x86-64", "x86-avx512", "host")
# fp32 FLOP per cycle per core, from the vendors' manuals (Zen 4: zmm FMA split in two).
FP32_PER_CYCLE = {"znver3": 32, "znver4": 32, "znver5": 64, "skylake-avx512": 64,
                  "icelake-server": 64, "sapphirerapids": 64, "x86-avx2": 32,
                  "x86-avx512": 64, "x86-64": 16}
# /proc/cpuinfo spelling -> LLVM feature name, where they differ.
LLVM_NAME = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "bmi1": "bmi",
             "abm": "lzcnt", "sha_ni": "sha", "cx16": "cx16", "avx512_vnni": "avx512vnni",
             "avx512_bf16": "avx512bf16", "avx512_vbmi2": "avx512vbmi2",
             "avx512_bitalg": "avx512bitalg", "avx512_vpopcntdq": "avx512vpopcntdq",
             "avx512_fp16": "avx512fp16", "avx_vnni": "avxvnni", "amx_tile": "amx-tile",
             "amx_bf16": "amx-bf16", "amx_int8": "amx-int8",
             "avx512_vp2intersect": "avx512vp2intersect", "vpclmulqdq": "vpclmulqdq"}


def test_required_names_exist():
    assert set(REQUIRED) <= set(targets.names())


@pytest.mark.parametrize("name", targets.names())
def test_every_target_has_sane_facts(name):
    t = targets.get(name)
    assert t.family == "x86" and t.llvm["kind"] == "llvm" and t.mcpu
    assert t.vector_bits in (128, 256, 512)
    assert t.has("sse", "sse2")
    assert t.has("avx512f") == (t.vector_bits == 512)
    assert t.vector_regs == (32 if t.has("avx512f") else 16)
    assert (t.fma_units > 0) == t.has("fma")
    assert 0 <= t.fma_units <= 2 and t.fma_bits in (128, 256, 512)
    assert t.fma_bits <= t.vector_bits and 3 <= t.fma_latency <= 6
    assert 16 <= t.l1d_kib <= 64 and 256 <= t.l2_kib <= 4096 and t.l3_kib >= 512
    assert t.cores == targets.machine_cores()
    assert t.lanes("float32") == t.vector_bits // 32 and t.lanes("int8") == t.vector_bits // 8
    assert t.lanes("bfloat16") == 2 * t.lanes("float32")
    assert t.fma_chains() >= 8 if t.fma_units == 2 else t.fma_chains() >= 1
    facts = t.facts()
    assert set(facts) >= {"vector_bits", "fma_units", "fma_bits", "vector_regs", "l1d_kib",
                          "l2_kib", "l3_kib", "cores", "isa", "flops_per_cycle", "uarch"}


@pytest.mark.parametrize("name", sorted(FP32_PER_CYCLE))
def test_fma_issue_rates(name):
    t = targets.get(name)
    assert t.flops_per_cycle("float32") == FP32_PER_CYCLE[name]
    if t.has("amx_tile"):  # the tile unit: a 16 x 16 x 32 (int8: x 64) product per 16 cycles
        assert t.flops_per_cycle("bfloat16") == 1024 and t.flops_per_cycle("int8") == 2048
    else:
        assert t.flops_per_cycle("bfloat16") == (
            2 * FP32_PER_CYCLE[name] if t.has("avx512_bf16") else 0)
        vnni = t.has("avx512_vnni") or t.has("avx_vnni")
        assert t.flops_per_cycle("int8") == (4 * FP32_PER_CYCLE[name] if vnni else 0)
    with pytest.raises(ValueError):
        t.flops_per_cycle("float64")


def test_extensions_by_generation():
    get = targets.get
    assert get("znver4").fma_bits == 256 and get("znver4").vector_bits == 512
    assert get("znver4").has("avx512_bf16", "avx512_vnni") and not get("znver3").has("avx512f")
    assert get("znver5").has("avx_vnni", "avx512_bf16") and get("znver5").fma_bits == 512
    assert get("icelake-server").has("avx512_vnni") and not get("icelake-server").has(
        "avx512_bf16")
    assert get("sapphirerapids").has("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16")
    assert not get("skylake-avx512").has("avx512_vnni")
    assert not get("x86-64").has("avx") and get("x86-64").fma_units == 0


@pytest.mark.parametrize("name", sorted(set(targets.names()) - {"host"}))
def test_table_agrees_with_llvm(name):
    """The ISA a row lists is what LLVM enables for its -mcpu (so ``runnable`` is honest)."""
    tvm = pytest.importorskip("tvm")
    t = targets.get(name)
    llvm = set(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(t.llvm)))
    mapped = {LLVM_NAME.get(f, f) for f in t.isa}
    assert mapped <= llvm, f"{name} lists what LLVM -mcpu={t.mcpu} lacks: {mapped - llvm}"
    for feature in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"):
        assert t.has(feature) == (LLVM_NAME.get(feature, feature) in llvm), (name, feature)


def test_host_detected_here():
    host = targets.get("host")
    flags = cpu.host_features()
    assert host.mcpu == __import__("tvm").target.codegen.llvm_get_system_cpu()
    assert host.isa <= flags and targets.runnable(host)
    assert host.has("avx2") == ("avx2" in flags) and host.has("avx512f") == ("avx512f" in flags)
    caches = cpu.host_caches()
    if "l1d" in caches:
        assert host.l1d_kib == caches["l1d"] and host.l2_kib == caches["l2"]
    assert host.flops_per_cycle("float32") > 0


def test_host_detection_described_machines():
    spr = cpu.detect_host("emeraldrapids", cpu.SAPPHIRE, {"l1d": 48, "l2": 2048, "l3": 5120})
    assert (spr.uarch, spr.fma_bits, spr.flops_per_cycle(), spr.vector_regs) == (
        "sapphirerapids", 512, 64, 32)
    assert spr.l3_kib == targets.get("sapphirerapids").l3_kib  # VM sysfs L3 not trusted
    assert spr.mcpu == "emeraldrapids" and spr.has("amx_tile")
    zen4 = cpu.detect_host("znver4", cpu.ZEN4, {})
    assert zen4.flops_per_cycle() == 32 and zen4.l2_kib == 1024  # sysfs missing: row facts
    odd = cpu.detect_host("mystery-cpu", frozenset({"sse", "sse2", "avx512f", "fma", "avx2"}),
                          {"l1d": 32, "l2": 1024, "l3": 1536})
    assert odd.vector_bits == 512 and odd.uarch == "skylake-avx512" and odd.l3_kib == 1536
    assert cpu.detect_host("mystery-cpu", cpu.SAPPHIRE | {"movdiri"}, {}).uarch == (
        "sapphirerapids")
    assert cpu.detect_host("mystery-cpu", cpu.ZEN4 | {"clzero"}, {}).uarch == "znver4"
    assert cpu.detect_host("mystery-cpu", cpu.HASWELL, {}).uarch == "haswell"
    sse = cpu.detect_host("mystery-cpu", frozenset({"sse", "sse2"}), {})
    assert sse.vector_bits == 128 and sse.fma_units == 0 and sse.isa == {"sse", "sse2"}


def test_row_by_flags_matches_each_row():
    for row, facts in cpu.UARCH.items():
        assert cpu.row_by_flags(facts[-1]) == row


def test_sysfs_cache_parsing(tmp_path):
    def index(n, level, kind, size, shared):
        d = tmp_path / f"index{n}"
        d.mkdir()
        for key, value in (("level", level), ("type", kind), ("size", size),
                           ("shared_cpu_list", shared)):
            (d / key).write_text(value + "\n")

    index(0, "1", "Data", "48K", "0")
    index(1, "1", "Instruction", "32K", "0")
    index(2, "2", "Unified", "2048K", "0")
    index(3, "3", "Unified", "105M", "0-27,56-83")
    assert cpu.host_caches(str(tmp_path)) == {"l1d": 48, "l2": 2048, "l3": 105 * 1024 // 56}
    assert cpu.host_caches(str(tmp_path / "absent")) == {}


def test_unknown_name():
    with pytest.raises(targets.UnknownTarget) as info:
        targets.get("bogus")
    assert isinstance(info.value, ValueError) and "znver4" in info.value.rule


def test_dsl_translates_unknown_target():
    import dsl

    with pytest.raises(dsl.DslError) as info, dsl.target("x86-avx1024"):
        pass
    assert info.value.code == "E60012" and info.value.param == "target"
    with dsl.target("x86-avx2") as t:
        assert t.name == "x86-avx2" and targets.current() is t


def test_targets_imports_nothing_from_dsl():
    code = ("import sys, targets, targets.cpu, targets.roof, targets.mca, targets.bandwidth\n"
            "targets.get('host'); targets.names()\n"
            "bad = sorted(m for m in sys.modules if m == 'dsl' or m.startswith('dsl.'))\n"
            "assert not bad, bad\n")
    root = str(Path(__file__).resolve().parents[2])  # this checkout's targets, not another's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
