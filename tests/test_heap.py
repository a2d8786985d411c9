"""gpscale.heap: glibc's malloc thresholds fixed once per process, so that a step's temporaries are reused from the
heap instead of faulted in afresh; the freed heap held while a fit runs and handed back after it; left alone off
glibc and where the user chose."""
import os
import subprocess
import sys
import textwrap

import pytest

from gpscale import heap

GLIBC = heap._mallopt() is not None


@pytest.fixture
def fresh(monkeypatch):
    """heap's once-per-process state reset, the environment's malloc settings removed, mallopt recorded."""
    calls = []
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setattr(heap, "_holders", 0)
    monkeypatch.setattr(heap, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    monkeypatch.setattr(heap, "_malloc_trim", lambda: lambda pad: calls.append(("trim", pad)) or 1)
    for name in (*heap._USER_SETTINGS, "GPSCALE_MALLOC"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_sets_both_thresholds_once(fresh):
    assert heap.keep_temporaries_on_heap() and heap.keep_temporaries_on_heap()
    assert fresh == [(-3, 32 << 20), (-1, 64 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


@pytest.mark.parametrize("name, value", [("GPSCALE_MALLOC", "default"), ("MALLOC_MMAP_THRESHOLD_", "131072"),
                                         ("MALLOC_TRIM_THRESHOLD_", "0"), ("MALLOC_TOP_PAD_", "0")])
def test_leaves_malloc_alone_where_the_environment_chose(fresh, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not heap.keep_temporaries_on_heap()
    assert fresh == []
    with heap.hold_freed_heap():
        pass
    assert fresh == []


def test_off_glibc_it_does_nothing(fresh, monkeypatch):
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    assert not heap.keep_temporaries_on_heap()
    with heap.hold_freed_heap():
        pass


def test_the_outermost_hold_sets_the_trim_threshold_and_hands_the_heap_back(fresh):
    """Nested holds (a fit inside a fit: GP-GRIEF's exact-GP start) raise the threshold once and restore it once,
    when the outer one ends, and an error inside restores it too."""
    M_TRIM = heap._M_TRIM_THRESHOLD
    thresholds = [(heap._M_MMAP_THRESHOLD, 32 << 20), (M_TRIM, 64 << 20)]
    with pytest.raises(RuntimeError, match="inside"):
        with heap.hold_freed_heap():
            assert fresh == [*thresholds, (M_TRIM, 1 << 30)]
            with heap.hold_freed_heap():
                pass
            assert fresh == [*thresholds, (M_TRIM, 1 << 30)]
            raise RuntimeError("inside")
    assert fresh == [*thresholds, (M_TRIM, 1 << 30), (M_TRIM, 64 << 20), ("trim", 0)]
    assert heap._holders == 0


def test_a_misspelt_setting_is_named(fresh, monkeypatch):
    monkeypatch.setenv("GPSCALE_MALLOC", "off")
    with pytest.raises(ValueError, match="GPSCALE_MALLOC must be 'tuned' or 'default', got 'off'"):
        heap.keep_temporaries_on_heap()
    assert fresh == []


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_temporaries_of_a_step_are_not_faulted_in_again():
    """In a fresh process: four 8 MiB temporaries a pass, made and freed ten times, fault in (almost) no pages once
    the thresholds are set (glibc's own rule: hundreds a pass)."""
    script = textwrap.dedent("""
        import resource, torch
        from gpscale.heap import keep_temporaries_on_heap
        assert keep_temporaries_on_heap()
        def step():
            a = torch.empty(2 << 20).fill_(1.0)
            b = torch.exp(a); c = b * a; d = c + b
            return d.sum()
        step(); step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            step()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
    """)
    env = {k: v for k, v in os.environ.items() if k not in (*heap._USER_SETTINGS, "GPSCALE_MALLOC")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert float(out.stdout.split()[-1]) < 50, out.stdout


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_step_beyond_the_trim_threshold_is_held_while_a_fit_runs_and_handed_back_after():
    """In a fresh process: a step that frees 96 MiB at once (twelve 8 MiB temporaries) faults its pages in anew each
    time under the 64 MiB trim threshold alone, not within :func:`hold_freed_heap`; after the block the resident
    memory is back near where it started."""
    script = textwrap.dedent("""
        import ctypes, resource, torch
        from gpscale.heap import hold_freed_heap, keep_temporaries_on_heap
        ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: pages of 4 KiB, as the count assumes
        def step():
            held = [torch.empty(2 << 20).fill_(1.0) for _ in range(12)]
            del held
        def faults_per_step():
            step(); step()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(5):
                step()
            return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
        def resident_mb():
            return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20
        assert keep_temporaries_on_heap()
        start = resident_mb()
        print(faults_per_step())
        with hold_freed_heap():
            print(faults_per_step())
        print(resident_mb() - start)
    """)
    env = {k: v for k, v in os.environ.items() if k not in (*heap._USER_SETTINGS, "GPSCALE_MALLOC")}
    # without glibc's caches of small freed chunks: a cached chunk stays in use, and one that lands above the
    # temporaries pins the heap's top, so whether a step is trimmed would depend on the layout (0 to 16,352 faults a
    # step in six runs with the caches, 16,352 in eight without)
    env["GLIBC_TUNABLES"] = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    trimmed, held, kept_mb = (float(v) for v in out.stdout.split()[-3:])
    assert trimmed > 2000 and held < 50 and kept_mb < 16, out.stdout


def test_fit_holds_the_freed_heap(monkeypatch):
    import contextlib
    import torch
    from gpscale.models import get_model_class
    from gpscale.train import fit
    seen = []

    @contextlib.contextmanager
    def recording():
        seen.append("enter")
        yield
        seen.append("exit")

    monkeypatch.setattr("gpscale.train.fitting.hold_freed_heap", recording)
    X = torch.randn(20, 2, dtype=torch.float64)
    fit(get_model_class("exact")(2), X, X[:, 0], epochs=1, progress=False)
    assert seen == ["enter", "exit"]
