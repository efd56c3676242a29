"""The roof measurement: the generated loop keeps its independent chains, the issue bound
refuses impossible figures (fake numbers), a real short run stays under the bound, the cache
answers the second call, and the llvm-mca helpers parse what they are given. No timing is
asserted beyond "positive and not above what the FMA pipes can issue"."""

import dataclasses
import shutil

import pytest

import targets
from targets import mca, roof

HAS_CC = shutil.which("cc") is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler")


def test_bound_refuses_impossible_figures():
    roof.check_bound(32 * 3.0e9, 3.0, 32)  # exactly the issue rate: fine
    roof.check_bound(32 * 3.0e9 * 1.04, 3.0, 32)  # timer jitter within tolerance
    with pytest.raises(roof.RoofError, match="exceeds the issue bound"):
        roof.check_bound(33 * 3.0e9 * 1.06, 3.0, 32)
    with pytest.raises(roof.RoofError, match="exceeds"):  # a merged-chain figure, 3x
        roof.check_bound(3 * 117e9, 3.7, 32)
    roof.check_bound(2 * 30 * 3.0e9, 3.0, 32, threads=2)
    with pytest.raises(roof.RoofError):
        roof.check_bound(2 * 34 * 3.0e9, 3.0, 32, threads=2)
    for rate, ghz in ((0.0, 3.0), (-1.0, 3.0), (1e9, 0.0), (float("nan"), 3.0)):
        with pytest.raises(roof.RoofError, match="not a measurement"):
            roof.check_bound(rate, ghz, 32)


@pytest.mark.parametrize("isa,dtype,nacc,flops", [
    ("sse", "float32", 12, 48), ("avx2", "float32", 12, 192), ("avx512", "float32", 24, 768),
    ("avx512", "bfloat16", 24, 1536), ("avx512", "int8", 24, 3072), ("avx2", "int8", 12, 768),
    ("amx", "bfloat16", 4, 4 * 16 * 16 * 32 * 2), ("amx", "int8", 4, 4 * 16 * 16 * 64 * 2)])
def test_loop_has_independent_chains(isa, dtype, nacc, flops):
    loop = roof.make_loop(isa, dtype)
    dests = [ins.rsplit(",", 1)[1].strip() for ins in loop.body]
    assert loop.nacc == nacc and len(set(dests)) == nacc and loop.flops == flops
    sources = {op.strip() for ins in loop.body for op in ins.split(None, 1)[-1].split(",")[:-1]}
    assert not sources & set(dests), "a source register must not be an accumulator"


def test_loop_choice_follows_the_isa():
    get = targets.get
    assert roof.loop_isa(get("znver3")) == "avx2" and roof.loop_isa(get("x86-64")) == "sse"
    assert roof.loop_isa(get("znver4"), "bfloat16") == "avx512"
    assert roof.loop_isa(get("znver3"), "int8") is None
    assert roof.loop_isa(get("skylake-avx512"), "bfloat16") is None
    vnni_ymm = dataclasses.replace(get("x86-avx2"), isa=get("x86-avx2").isa | {"avx_vnni"})
    assert roof.loop_isa(vnni_ymm, "int8") == "avx2"
    # with AMX the bf16 and int8 roofs are the tile unit's, fp32 stays on the FMA pipes
    spr = get("sapphirerapids")
    assert roof.loop_isa(spr, "bfloat16") == roof.loop_isa(spr, "int8") == "amx"
    assert roof.loop_isa(spr) == "avx512"
    assert spr.flops_per_cycle("bfloat16") == 16 * 16 * 32 * 2 // 16
    assert spr.flops_per_cycle("int8") == 2 * spr.flops_per_cycle("bfloat16")
    no_amx = dataclasses.replace(spr, isa=spr.isa - {"amx_tile"})
    assert roof.loop_isa(no_amx, "bfloat16") == "avx512"
    assert no_amx.flops_per_cycle("bfloat16") == 2 * no_amx.flops_per_cycle()


def test_amx_loop_source_asks_for_the_tiles():
    """The AMX program requests the tile state from Linux, configures every tile and
    releases them after the loop (else the first tile instruction faults)."""
    text = roof.c_source(roof.make_loop("amx", "bfloat16"))
    assert "arch_prctl" in text and "amx_setup();" in text
    assert "ldtilecfg" in text and "tilerelease" in text and text.count("tdpbf16ps") == 4
    assert "amx_setup();" not in roof.c_source(roof.make_loop("avx512", "bfloat16"))


@needs_cc
def test_amx_roof_runs_where_the_host_has_tiles():
    host = targets.get("host")
    if roof.loop_isa(host, "bfloat16") != "amx":
        pytest.skip("this machine has no AMX")
    r = roof.measure("bfloat16", 1, seconds=0.02, reps=2)
    assert r.isa == "amx" and r.mnemonic == "tdpbf16ps" and r.chains == 4
    assert 0 < r.gflops <= r.bound_gflops * (1 + roof.TOLERANCE)


def test_disassembly_check_refuses_merged_or_spilled_chains():
    loop = roof.make_loop("avx2")
    good = "\n".join(f"  40: {ins}" for ins in loop.body)
    roof.check_disassembly(good, loop)
    merged = "\n".join(f"  40: vfmadd231ps %ymm14,%ymm15,%ymm{i % 3}" for i in range(12))
    with pytest.raises(roof.RoofError, match="3 distinct"):
        roof.check_disassembly(merged, loop)
    with pytest.raises(roof.RoofError):
        roof.check_disassembly("\n".join(good.splitlines()[:6]), loop)


@needs_cc
def test_compiled_loop_keeps_every_chain(tmp_path):
    loop = roof.make_loop(roof.loop_isa(targets.get("host")))
    exe = roof.compile_loop(loop, tmp_path)  # raises if the disassembly lost a chain
    asm = roof.disassemble(exe, "roof_loop")
    if asm:
        assert len(set(roof.accumulators(asm, loop.mnemonic.split("/")[0]))) >= loop.nacc // 2


@needs_cc
@pytest.mark.parametrize("name", ["host", "x86-64"])
def test_real_short_run_is_under_the_bound(name):
    tgt = targets.get(name)
    r = roof.measure("float32", 1, target=tgt, seconds=0.02, reps=2)
    assert 0 < r.gflops <= r.bound_gflops * (1 + roof.TOLERANCE)
    assert r.ghz > 0.3 and r.chains >= tgt.fma_chains() and r.flops_per_cycle == (
        tgt.flops_per_cycle())


@needs_cc
def test_all_cores_run():
    n = targets.machine_cores()
    r = roof.measure("float32", n, seconds=0.02, reps=1)
    assert r.threads == n and len(r.cpus) == n
    assert 0 < r.gflops <= r.bound_gflops * (1 + roof.TOLERANCE)
    with pytest.raises(roof.RoofError, match="threads"):
        roof.measure("float32", n + 1, seconds=0.01, reps=1)


def test_missing_instruction_is_refused():
    if roof.loop_isa(targets.get("host"), "int8") is not None:
        pytest.skip("this machine has int8 dot products")
    with pytest.raises(roof.RoofError, match="no int8"):
        roof.measure("int8", 1)


@needs_cc
def test_cache_answers_the_second_call(tmp_path, monkeypatch):
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    first = roof.measured_peak("float32", 1, seconds=0.02, reps=1)
    path = roof.cache_file()
    assert path.is_file() and path.parent == tmp_path / "roof"
    assert targets.get("host").mcpu in path.name

    def no_measure(*a, **k):
        raise AssertionError("measured again instead of using the cache")

    monkeypatch.setattr(roof, "measure", no_measure)
    assert roof.measured_peak("float32", 1) == first
    path.write_text("{not json")  # a corrupt cache is measured again, not an error
    monkeypatch.undo()
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    assert roof.measured_peak("float32", 1, seconds=0.02, reps=1).gflops > 0


def test_parse_refuses_incomplete_output():
    loop = roof.make_loop("avx2")
    with pytest.raises(roof.RoofError, match="incomplete"):
        roof._parse("n_fma 10\nrep 0 thread 0 secs 1 cpu 1 ghz 3 3\n", loop, 2)
    best, samples = roof._parse("n_fma 1000\nrep 0 thread 0 secs 2 cpu 1 ghz 3 3.5\n", loop, 1)
    assert best == [(1000 * 192 / 1.0, 3.5, 2.0, 1.0)] and samples == best


def test_samples_are_held_to_the_highest_clock_read():
    # The 16-core VM: an AMX loop at 2048 FLOP/cycle x 2.73 GHz, one clock reading 2.55.
    at_bound = (2048 * 2.73e9, 2.546, 0.2, 0.2)
    other = (2048 * 2.70e9, 2.73, 0.2, 0.2)
    roof.check_samples([at_bound, other], 2048)
    merged = (3 * 2048 * 2.73e9, 2.73, 0.2, 0.2)  # chains merged: 3x over, still refused
    with pytest.raises(roof.RoofError, match="refused"):
        roof.check_samples([merged, other], 2048)


FAKE_KERNEL = """\
main:
\tpushq %rbp
.LBB0_1:
\tvmovups (%rdi), %ymm0
\taddq $32, %rdi
\tcmpq %rsi, %rdi
\tjne .LBB0_1
.LBB0_2:
\tvbroadcastss (%rax), %ymm1
\tvfmadd231ps (%r9), %ymm1, %ymm10   # comment
\t.p2align 4
\tvfmadd231ps 32(%r9), %ymm1, %ymm11
\taddq $4, %rax
\tjne .LBB0_2
\tretq
"""


def test_hot_loop_and_flops():
    loop = mca.hot_loop(FAKE_KERNEL)
    assert loop[0] == ".LBB0_2:" and loop[-1].strip().startswith("jne")
    assert not any(".p2align" in s or "#" in s for s in loop)
    assert mca.fma_flops(loop) == 2 * 8 * 2
    assert mca.hot_loop("main:\n\tretq\n") == []


@pytest.mark.skipif(mca.tool() is None, reason="llvm-mca not installed")
def test_mca_predicts_the_roof_loop():
    loop = roof.make_loop("avx2")
    pred = mca.predict([".L0:", *loop.body, "dec %rcx", "jnz .L0"], "haswell")
    assert pred.cycles_per_iter >= 6 * 0.95  # 12 FMAs on two pipes: at least 6 cycles
    with pytest.raises(mca.Unavailable):
        mca.predict(list(loop.body), "no-such-cpu")


@pytest.mark.skipif(mca.tool() is None, reason="llvm-mca not installed")
def test_mca_answers_an_alias_with_its_rows_model():
    """Debian's llvm-mca 14 has no ``emeraldrapids``: Sapphire Rapids' model answers (a
    newer one answers itself), and the prediction names the model used."""
    loop = roof.make_loop("avx512")
    pred = mca.predict([".L0:", *loop.body, "dec %rcx", "jnz .L0"], "emeraldrapids")
    assert pred.mcpu in ("emeraldrapids", "sapphirerapids")
    assert pred.cycles_per_iter >= 12 * 0.95  # 24 zmm FMAs on two pipes


def test_peak_cli(tmp_path, monkeypatch, capsys):
    if not HAS_CC:
        pytest.skip("no C compiler")
    from dsl.cli import peak

    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    assert peak.main(["--dtype", "float32", "--threads", "1", "--seconds", "0.02",
                      "--reps", "1", "--mca"]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "cached in" in out and "FLOP/cycle/core" in out
    assert "llvm-mca" in out
    assert peak.main(["--dtype", "float64"]) == 2
    with pytest.raises(SystemExit) as info:
        peak.main(["--threads", str(targets.machine_cores() + 1)])
    assert info.value.code == 2


def test_bench_rows_get_percent_of_roof(monkeypatch, capsys):
    from dsl.cli.bench import runner

    fake = roof.Roof("float32", 2, (0, 1), "avx2", "vfmadd231ps", 12, 200.0, 100.0, 3.1, 32,
                     198.4, 190.0, 0.99, 0.2, 5, "znver3")
    monkeypatch.setattr(roof, "measured_peak", lambda dtype, threads: fake)
    rows = [{"suite": "s", "name": "a", "kind": "dx", "ours_gflops": 150.0, "peer_gflops": None,
             "ratio": None, "ours_s": 1e-3, "peer_s": None, "build_s": 0.1},
            {"suite": "s", "name": "b", "kind": "dx", "error": "boom", "ours_gflops": None}]
    runner.add_roof(rows, 2)
    assert rows[0]["roof_pct"] == 75.0 and "roof_pct" not in rows[1]
    printed = capsys.readouterr().out
    assert "200.0 GFLOP/s on 2 thread(s)" in printed and "at once" not in printed
    assert runner.format_row(rows[0]).endswith("75.0%")
    # threads that did not all run at once (a shared VM): the wall-time figure is said too
    monkeypatch.setattr(roof, "measured_peak",
                        lambda dtype, threads: dataclasses.replace(fake, gflops_wall=120.0))
    runner.add_roof([dict(rows[0])], 2)
    assert "all 2 threads at once reached 120.0 GFLOP/s" in capsys.readouterr().out

    def refuse(dtype, threads):
        raise roof.RoofError("no cc")

    monkeypatch.setattr(roof, "measured_peak", refuse)
    rows = [dict(rows[0])]
    rows[0].pop("roof_pct")
    runner.add_roof(rows, 2)
    assert "roof_pct" not in rows[0] and "unavailable" in capsys.readouterr().out


def test_cache_refuses_an_entry_of_another_instruction(tmp_path, monkeypatch):
    """A roof measured with another instruction than the one the host's kernels now use (the
    bfloat16 roof before AMX counted) is not served."""
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    fake = roof.Roof("float32", 1, (0,), "avx512", "vfmadd231ps", 24, 10.0, 10.0, 1.0, 64, 64.0,
                     10.0, 1.0, 0.1, 1, "x")
    host_isa = roof.loop_isa(targets.get("host"))
    roof._store({"float32/1": {**dataclasses.asdict(fake), "isa": host_isa}})
    assert roof.cached("float32", 1).isa == host_isa
    roof._store({"float32/1": {**dataclasses.asdict(fake), "isa": "not-" + host_isa}})
    assert roof.cached("float32", 1) is None
