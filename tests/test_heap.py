"""gpscale.heap: glibc's malloc thresholds fixed once per process, so that a step's temporaries are reused from the
heap instead of faulted in afresh; left alone off glibc and where the user chose."""
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
    monkeypatch.setattr(heap, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
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


def test_off_glibc_it_does_nothing(fresh, monkeypatch):
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    assert not heap.keep_temporaries_on_heap()


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
    env = {k: v for k, v in __import__("os").environ.items() if k not in (*heap._USER_SETTINGS, "GPSCALE_MALLOC")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert float(out.stdout.split()[-1]) < 50, out.stdout


def test_fit_sets_them(monkeypatch):
    import torch
    from gpscale.models import get_model_class
    from gpscale.train import fit
    seen = []
    monkeypatch.setattr("gpscale.train.keep_temporaries_on_heap", lambda: seen.append(True))
    X = torch.randn(20, 2, dtype=torch.float64)
    fit(get_model_class("exact")(2), X, X[:, 0], epochs=1, progress=False)
    assert seen == [True]
