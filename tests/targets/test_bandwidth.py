"""The memory-bandwidth roof: the refusal rule (fake figures), the kernels' assembly checks
(fake and real assembly, every ISA we build for), a real small run of the measuring process
(results checked, no rate asserted), and the cache beside the FMA roof (a fake measurement)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from targets import bandwidth, roof

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def test_refuses_impossible_or_meaningless_figures():
    caches = 33 << 20
    bandwidth.check_bandwidth(20.0, 512 << 20, caches, 384.0)  # a DRAM figure: fine
    for bad in (0.0, -3.0, float("nan"), float("inf")):
        with pytest.raises(roof.RoofError, match="not a measurement"):
            bandwidth.check_bandwidth(bad, 512 << 20, caches, 384.0)
    with pytest.raises(roof.RoofError, match="would be the cache's"):
        bandwidth.check_bandwidth(20.0, 64 << 20, caches, 384.0)  # under 4 x the caches
    with pytest.raises(bandwidth.BandwidthError, match="exceeds what their load ports"):
        bandwidth.check_bandwidth(500.0, GIB, caches, 384.0, "read", 1)
    bandwidth.check_bandwidth(20.0, GIB, caches, 768.0, "copy", 2, busy=0.9)
    with pytest.raises(roof.RoofError, match="busy 0.35"):  # the cores were shared
        bandwidth.check_bandwidth(7.0, GIB, caches, 768.0, "copy", 2, busy=0.35)


def test_timing_prefers_passes_that_had_their_cores(monkeypatch):
    """Fake clocks: the fastest pass whose CPU time shows the threads ran wins; with none,
    passes go on until the budget is spent, then the fastest of all is kept."""
    walls, cpus = [1.0, 0.5, 0.6, 0.4, 0.7], [2.0, 0.5, 1.2, 0.4, 1.4]  # 2 threads
    clock = {"wall": 0.0, "cpu": 0.0, "i": -1}

    def fn():
        clock["i"] += 1
        i = clock["i"] % len(walls)
        clock["wall"] += walls[i]
        clock["cpu"] += cpus[i]

    monkeypatch.setattr(bandwidth.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(bandwidth.time, "process_time", lambda: clock["cpu"])
    # 0.5 and 0.4 were shared (busy 0.5): 0.6 is the fastest pass that had its cores
    assert bandwidth._time(fn, 4, 2) == pytest.approx((0.6, 1.2))
    walls[:], cpus[:] = [0.5, 0.4], [0.5, 0.4]  # always shared
    clock["i"] = -1
    assert bandwidth._time(fn, 2, 2, budget=5.0) == pytest.approx((0.4, 0.4))
    assert clock["i"] >= 10  # kept looking for about 5 s of passes


def test_bound_and_buffer_follow_the_target():
    avx2, avx512 = targets.get("znver3"), targets.get("skylake-avx512")
    assert bandwidth.bound_gbps(avx2, 1) == 2 * 32 * bandwidth.MAX_GHZ
    assert bandwidth.bound_gbps(avx512, 4) == 4 * 2 * 64 * bandwidth.MAX_GHZ
    host = targets.get("host")
    size = bandwidth.buffer_bytes(host)
    assert size >= bandwidth.MIN_BYTES
    assert size >= bandwidth.CACHE_MULTIPLE * bandwidth.cache_bytes(host)
    assert bandwidth.buffer_bytes(host, 1 << 20) == 1 << 20
    assert bandwidth.cache_bytes(host) >= (host.l2_kib + host.l3_kib) * 1024


def _loop(body):
    return "\n".join([".LBB0_1:", *(f"\t{ins}" for ins in body), "\tjne\t.LBB0_1", "\tretq"])


def test_read_check_wants_independent_memory_adds():
    good = [f"vaddps\t{32 * i}(%rdi,%rcx), %ymm{i}, %ymm{i}" for i in range(8)]
    assert bandwidth.check_read_asm(_loop([*good, "addq\t$256, %rcx"])) == 8
    sse = [f"addps\t{16 * i}(%rdi), %xmm{i}" for i in range(8)]
    assert bandwidth.check_read_asm(_loop(sse)) == 8
    merged = [f"vaddps\t{32 * i}(%rdi,%rcx), %ymm{i % 2}, %ymm{i % 2}" for i in range(8)]
    with pytest.raises(roof.RoofError, match="2 distinct registers"):
        bandwidth.check_read_asm(_loop(merged))
    spilled = [*good, "vmovups\t%ymm0, (%rsp)"]
    with pytest.raises(roof.RoofError, match="1 stores"):
        bandwidth.check_read_asm(_loop(spilled))
    with pytest.raises(roof.RoofError):
        bandwidth.check_read_asm("main:\n\tretq\n")
    # an outer loop holding the inner one (and the stores after it) is not the hot loop
    nested = "\n".join([".LBB0_0:", _loop(good).rsplit("\tretq", 1)[0].rstrip(),
                        "\tvmovups\t%ymm0, (%rax)", "\tjne\t.LBB0_0", "\tretq"])
    assert bandwidth.check_read_asm(nested) == 8


def test_copy_check_wants_a_plain_vector_loop():
    good = ["vmulps\t(%rdi,%rcx), %ymm0, %ymm1", "vmovups\t%ymm1, (%rsi,%rcx)"]
    bandwidth.check_copy_asm(_loop(good))
    with pytest.raises(roof.RoofError, match="not a vector load-multiply-store"):
        bandwidth.check_copy_asm(_loop([*good, "callq\tmemcpy@PLT"]))
    with pytest.raises(roof.RoofError):
        bandwidth.check_copy_asm(_loop(["vmulps\t(%rdi), %ymm0, %ymm1",
                                        "vmovntps\t%ymm1, (%rsi)"]))
    with pytest.raises(roof.RoofError):
        bandwidth.check_copy_asm(_loop(["vmovups\t(%rdi), %ymm1", "vmovups\t%ymm1, (%rsi)"]))


@pytest.mark.parametrize("name", ["host", "x86-64", "skylake-avx512"])
def test_generated_kernels_pass_their_checks(name):
    """LLVM keeps the eight sums in registers and the copy a plain loop, on every ISA (built
    only: nothing runs, so a target the host cannot run is fine)."""
    tgt = targets.get(name)
    lib, shape = bandwidth.build_kernel("read", 2, 3 << 20, tgt)
    assert shape[0] == 2 and shape[2] == bandwidth.ACCUMULATORS * tgt.lanes("float32")
    assert bandwidth.check_read_asm(lib.mod.inspect_source("asm")) >= bandwidth.ACCUMULATORS
    lib, _ = bandwidth.build_kernel("copy", 2, 3 << 20, tgt)
    bandwidth.check_copy_asm(lib.mod.inspect_source("asm"))


def test_measuring_process_small_run():
    """The child process end to end on a small buffer (the caller's refusal rule is not
    applied to these raw figures): both kinds, every count, results checked inside."""
    env = {**os.environ, "TVM_BIND_THREADS": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    counts = sorted({1, targets.machine_cores()})
    proc = subprocess.run([sys.executable, "-m", "targets.bandwidth",
                           ",".join(map(str, counts)), str(8 << 20), "1"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["kind"], r["threads"]) for r in raw] == [
        (k, n) for n in counts for k in bandwidth.KINDS]
    for r in raw:
        assert r["seconds"] > 0 and r["nbytes"] == 8 << 20 and r["busy"] > 0
        assert r["accumulators"] == (bandwidth.ACCUMULATORS if r["kind"] == "read" else 0)
    # a small buffer is exactly what the caller refuses
    with pytest.raises(roof.RoofError, match="cache"):
        bandwidth._result(raw[0], targets.get("host"), 1)


def test_measure_refuses_thread_counts_beyond_the_machine():
    with pytest.raises(roof.RoofError, match="threads"):
        bandwidth.measure([targets.machine_cores() + 1])


def _fake(kind, threads, gbps=10.0):
    return bandwidth.Bandwidth(kind, threads, gbps, gbps / threads, 512 << 20, 0.05, 5, 1.0,
                               33 << 20, 384.0 * threads, 8 if kind == "read" else 0, 256,
                               "znver3")


def test_cache_beside_the_fma_roof(tmp_path, monkeypatch):
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(counts, nbytes=None, reps=5):
        calls.append(list(counts))
        return {(k, n): _fake(k, n, 10.0 * n) for n in counts for k in bandwidth.KINDS}

    monkeypatch.setattr(bandwidth, "measure", fake_measure)
    got = roof.measured_bandwidths([1])
    assert got[("copy", 1)] == _fake("copy", 1) and calls == [[1]]
    data = json.loads(roof.cache_file().read_text())
    assert {"bandwidth-read/1", "bandwidth-copy/1"} <= set(data)
    assert roof.measured_bandwidth("read", 1) == _fake("read", 1) and calls == [[1]]
    roof.measured_bandwidths([1, 2])  # only the missing count is measured
    assert calls == [[1], [2]]
    roof.measured_bandwidth("copy", 1, refresh=True)
    assert calls == [[1], [2], [1]]
    # an entry written by another version of the module is measured again, not an error
    data = json.loads(roof.cache_file().read_text())
    data["bandwidth-copy/2"] = {"kind": "copy", "gigabytes": 1}
    roof.cache_file().write_text(json.dumps(data))
    assert roof.cached_bandwidth("copy", 2) is None
    roof.measured_bandwidth("copy", 2)
    assert calls[-1] == [2]
    # so is one measured on shared cores
    data = json.loads(roof.cache_file().read_text())
    data["bandwidth-read/2"]["busy"] = 0.3
    roof.cache_file().write_text(json.dumps(data))
    assert roof.cached_bandwidth("read", 2) is None and roof.cached_bandwidth("copy", 2)


def test_refused_figure_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))

    def refuse(counts, nbytes=None, reps=5):
        raise bandwidth.BandwidthError("refused")

    monkeypatch.setattr(bandwidth, "measure", refuse)
    with pytest.raises(roof.RoofError, match="refused"):
        roof.measured_bandwidth("copy", 1)
    assert not roof.cache_file().exists()


def test_peak_prints_the_memory_roof(tmp_path, monkeypatch, capsys):
    from dsl.cli import peak

    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    fma = roof.Roof("float32", 1, (0,), "avx2", "vfmadd231ps", 12, 90.0, 90.0, 2.9, 32, 92.8,
                    90.0, 1.0, 0.2, 5, "znver3")
    monkeypatch.setattr(roof, "measured_peak", lambda *a, **k: dataclasses.replace(fma))
    monkeypatch.setattr(bandwidth, "measure", lambda counts, nbytes=None, reps=5: {
        (k, n): _fake(k, n, 12.5) for n in counts for k in bandwidth.KINDS})
    assert peak.main(["--dtype", "float32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "memory" in out and "read " in out and "copy " in out and "12.5" in out
    assert "bench's GB/s rows use copy" in out
    assert peak.main(["--dtype", "float32", "--threads", "1", "--no-memory"]) == 0
    assert "copy " not in capsys.readouterr().out

    def refuse(counts, nbytes=None, reps=5):
        raise bandwidth.BandwidthError("too fast")

    monkeypatch.setattr(bandwidth, "measure", refuse)
    assert peak.main(["--dtype", "float32", "--threads", "1", "--refresh"]) == 1
    assert "refused: too fast" in capsys.readouterr().err
