"""fairkv.plan / fairkv.compact over numpy arrays, against independent numpy references."""

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fairkv


def rng(seed=0):
    return np.random.default_rng(seed)


def indexed_cache(batch, heads, tokens, dim, dtype=np.float32):
    """K and V whose rows encode (head, token), so that compaction can be checked row by row."""
    k = np.empty((batch, heads, tokens, dim), dtype=dtype)
    for h in range(heads):
        for t in range(tokens):
            k[:, h, t, :] = h * 1000 + t
    v = -k
    return k, v


def largest_remainder_ok(counts, sizes, n_keep):
    """The largest-remainder split, checked by its definition (independent of how ties are broken): each group
    gets floor(share) or floor(share) + 1, the sum is n_keep, and no group that got +1 has a smaller remainder
    than one that did not."""
    total = sum(sizes)
    shares = [n_keep * s / total for s in sizes]
    floors = [int(np.floor(n_keep * s // total)) for s in sizes]
    assert sum(counts) == n_keep
    up = []
    for c, f in zip(counts, floors):
        assert c in (f, f + 1), (counts, shares)
        up.append(c == f + 1)
    rems = [n_keep * s % total for s in sizes]
    if any(up) and not all(up):
        assert min(r for r, u in zip(rems, up) if u) >= max(r for r, u in zip(rems, up) if not u)


def test_knorm_uniform_is_per_head_top_k_of_the_negated_norm():
    k = rng(1).standard_normal((2, 3, 50, 16), dtype=np.float32)
    for ratio in (0.1, 0.5, 0.9):
        p = fairkv.plan(k, ratio=ratio)
        n = max(1, int(50 * (1 - ratio)))
        assert p.counts.tolist() == [[n] * 3] * 2
        for b in range(2):
            for h in range(3):
                # K-norm keeps the keys of smallest L2 norm (kvpress's KnormPress scores -||k||).
                want = np.sort(np.argsort(np.linalg.norm(k[b, h], axis=-1), kind="stable")[:n])
                assert p.kept(b, h).tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_compact_moves_the_kept_rows_in_place_in_order(dtype):
    k, v = indexed_cache(1, 2, 40, 4, dtype)
    p = fairkv.plan(k, ratio=0.6, whitelist=[0, 39])
    before_k = k.copy()
    fairkv.compact(p, k, v)
    for h in range(2):
        kept = p.kept(0, h)
        n = p.counts[0, h]
        np.testing.assert_array_equal(k[0, h, :n], before_k[0, h, kept])
        np.testing.assert_array_equal(v[0, h, :n], -before_k[0, h, kept])
        assert 0 in kept and 39 in kept


def test_views_into_a_larger_cache_are_read_and_written_where_they_are():
    # An engine's cache with room for 64 tokens, 40 filled, viewed without a copy; head-major transposed V.
    cache_k = np.zeros((1, 2, 64, 8), dtype=np.float32)
    cache_v = np.zeros((1, 2, 8, 64), dtype=np.float32)  # [batch, heads, dim, tokens]
    filled_k, _ = indexed_cache(1, 2, 40, 8)
    cache_k[:, :, :40] = filled_k
    cache_v[:, :, :, :40] = np.swapaxes(-filled_k, 2, 3)
    keys = cache_k[:, :, :40]
    values = np.swapaxes(cache_v, 2, 3)[:, :, :40]  # strides (…, 1, 64): tokens fastest
    assert not values.flags.c_contiguous
    p = fairkv.plan(keys, ratio=0.5)
    fairkv.compact(p, keys, values)
    for h in range(2):
        kept = p.kept(0, h)
        np.testing.assert_array_equal(cache_k[0, h, :20, 0], filled_k[0, h, kept, 0])
        np.testing.assert_array_equal(cache_v[0, h, 0, :20], -filled_k[0, h, kept, 0])
    assert np.all(cache_k[:, :, 40:] == 0) and np.all(cache_v[:, :, :, 40:] == 0)


def test_external_scores_any_strides():
    s = rng(2).standard_normal((2, 40, 3), dtype=np.float32)  # [batch, tokens, heads] in memory
    scores = np.transpose(s, (0, 2, 1))                         # viewed as [batch, heads, tokens]
    p = fairkv.plan(scores=scores, ratio=0.75)
    assert p.policy.startswith("external")
    for b in range(2):
        for h in range(3):
            want = np.sort(np.argsort(-scores[b, h], kind="stable")[:10])
            assert p.kept(b, h).tolist() == want.tolist()


def test_fair_splits_the_budget_by_largest_remainder_and_keeps_the_sinks():
    r = rng(3)
    for trial in range(40):
        L = int(r.integers(20, 120))
        cuts = sorted(r.choice(np.arange(1, L), size=3, replace=False).tolist())
        segments = [(cuts[0], cuts[1]), (cuts[1], cuts[2])]
        scores = r.standard_normal((1, 2, L), dtype=np.float32)
        ratio = float(r.choice([0.2, 0.5, 0.7, 0.9]))
        n_keep = max(1, int(L * (1 - ratio)))
        p = fairkv.plan(scores=scores, segments=segments, ratio=ratio, sinks=0)
        groups = [set(range(b, e)) for b, e in segments]
        groups.append(set(range(L)) - groups[0] - groups[1])
        for h in range(2):
            kept = set(p.kept(0, h).tolist())
            counts = [len(kept & g) for g in groups]
            largest_remainder_ok(counts, [len(g) for g in groups], n_keep)
            # Within each group the highest scores win.
            for g, c in zip(groups, counts):
                order = sorted(g, key=lambda t: (-scores[0, h, t], t))
                assert kept & g == set(order[:c])
        # The default keeps the first four tokens (attention sinks) whenever the budget allows.
        p4 = fairkv.plan(scores=scores, segments=segments, ratio=ratio)
        if n_keep >= 4:
            assert set(range(4)) <= set(p4.kept(0, 0).tolist())


def test_a_token_budget_keeps_that_many_tokens_and_a_shorter_sequence_whole():
    r = rng(8)
    k = r.standard_normal((2, 3, 50, 8), dtype=np.float32)
    for budget in (1, 7, 25, 49, 50, 500):
        p = fairkv.plan(k, budget=budget, segments=[(4, 20), (20, 45)])
        assert p.counts.tolist() == [[min(budget, 50)] * 3] * 2
    # The same plan as the ratio that keeps as many tokens.
    np.testing.assert_array_equal(fairkv.plan(k, budget=25).indices, fairkv.plan(k, ratio=0.5).indices)
    # -2**63 once equalled the library's "no budget" sentinel and kept everything; True was taken as 1.
    for bad, text in ((0, "budget"), (-3, "budget"), (-2**63, "-9223372036854775808 is negative"),
                      (True, "budget must be an integer, not bool"), (2.5, "budget must be an integer, not float")):
        with pytest.raises(fairkv.Error) as e:
            fairkv.plan(k, budget=bad)
        assert e.value.status == "invalid argument" and text in str(e.value)
    with pytest.raises(fairkv.Error) as e:
        fairkv.plan(k, budget=2**64)
    assert e.value.status == "out of range" and "budget does not fit in 64 bits" in str(e.value)
    assert fairkv.plan(k, budget=np.int64(7)).counts.tolist() == [[7] * 3] * 2
    with pytest.raises(fairkv.Error) as e:
        fairkv.plan(k, budget=3, whitelist=[1, 2, 3, 4])
    assert e.value.status == "budget exceeded" and "a budget of 3 tokens" in str(e.value)


def test_whitelist_is_always_kept():
    r = rng(4)
    k = r.standard_normal((1, 4, 80, 8), dtype=np.float32)
    wl = [0, 5, 17, 79]
    for allocator in ("whitelist", "fair_with_whitelist", "debias"):
        kw = {} if allocator == "whitelist" else {"segments": [(10, 40), (40, 70)]}
        p = fairkv.plan(k, whitelist=wl, allocator=allocator, ratio=0.9, **kw)
        for h in range(4):
            assert set(wl) <= set(p.kept(0, h).tolist())


def test_attention_scorers_read_queries():
    r = rng(5)
    k = r.standard_normal((1, 2, 48, 8), dtype=np.float32)
    q = r.standard_normal((1, 4, 48, 8), dtype=np.float32)
    for scorer in ("snapkv", "tova", "h2o"):
        p = fairkv.plan(k, queries=q, scorer=scorer, window=8, ratio=0.5)
        assert p.counts.tolist() == [[24, 24]]
    with pytest.raises(fairkv.Error) as e:
        fairkv.plan(k, scorer="snapkv", ratio=0.5)
    assert e.value.status == "missing input" and "queries" in str(e.value)


def test_the_exported_names_are_the_ones_plan_takes_and_lists_when_it_refuses():
    # The library's registry, as the README and docs/python.md name it; plan takes each name and its refusal
    # lists exactly these.
    assert fairkv.SCORERS == ("knorm", "streaming_llm", "snapkv", "tova", "h2o", "external", "random")
    assert fairkv.SELECTORS == ("per_head", "union_heads", "head_adaptive")
    assert fairkv.ALLOCATORS == ("uniform", "whitelist", "fair", "fair_with_whitelist", "debias", "fair_paper",
                                 "prioritized")
    r = rng(6)
    k = r.standard_normal((1, 2, 32, 8), dtype=np.float32)
    q = r.standard_normal((1, 4, 32, 8), dtype=np.float32)
    s = r.standard_normal((1, 2, 32), dtype=np.float32)
    for scorer in fairkv.SCORERS:
        extra = {"scores": s} if scorer == "external" else {"queries": q}
        assert fairkv.plan(k, scorer=scorer, window=8, ratio=0.5, **extra).counts.sum() > 0
    for selector in fairkv.SELECTORS:
        assert fairkv.plan(k, selector=selector, ratio=0.5).counts.sum() > 0
    for allocator in fairkv.ALLOCATORS:
        needs_segments = allocator in ("fair", "fair_with_whitelist", "debias", "fair_paper", "prioritized")
        seg = {"segments": [(0, 16), (16, 32)]} if needs_segments else {}
        wl = {"whitelist": [3]} if allocator in ("whitelist", "fair_with_whitelist") else {}
        pri = {"priorities": [(1.0, 0.0), (2.0, 0.0)]} if allocator == "prioritized" else {}
        assert fairkv.plan(k, allocator=allocator, ratio=0.5, **seg, **wl, **pri).counts.sum() > 0
    for kind, names in (("scorer", fairkv.SCORERS), ("selector", fairkv.SELECTORS),
                        ("allocator", fairkv.ALLOCATORS)):
        with pytest.raises(fairkv.Error) as e:
            fairkv.plan(k, ratio=0.5, **{kind: "nope"})
        assert str(e.value).endswith("(" + ", ".join(names) + ")"), str(e.value)


def test_the_random_scorer_keeps_a_reproducible_random_subset_chosen_by_its_seed():
    k = np.zeros((1, 2, 1000, 4), dtype=np.float32)  # keys are not read
    a = fairkv.plan(k, scorer="random", seed=5, ratio=0.5)
    b = fairkv.plan(k, scorer="random", seed=5, ratio=0.5)
    c = fairkv.plan(k, scorer="random", seed=6, ratio=0.5)
    assert a.counts.tolist() == [[500, 500]]
    assert np.array_equal(a.indices, b.indices)
    assert not np.array_equal(a.kept(0, 0), c.kept(0, 0))
    assert not np.array_equal(a.kept(0, 0), a.kept(0, 1))  # each head draws its own subset
    first_half = int((a.kept(0, 0) < 500).sum())
    # Uniform over positions: about half of the 500 kept lie in the first half (hypergeometric, sd 8; the hash is
    # fixed, so this is deterministic).
    assert 200 < first_half < 300
    with pytest.raises((TypeError, OverflowError)):
        fairkv.plan(k, scorer="random", seed=-1, ratio=0.5)


def test_plan_arrays_are_read_only_views_that_outlive_the_plan():
    k = rng(6).standard_normal((1, 2, 30, 4), dtype=np.float32)
    indices = fairkv.plan(k, ratio=0.5).indices
    gc.collect()
    assert indices.shape == (1, 2, 30) and not indices.flags.writeable
    assert np.all(np.diff(indices[0, 0, :15]) > 0)


def test_errors_are_value_errors_with_the_library_message_and_leave_the_arrays_untouched():
    k, v = indexed_cache(1, 2, 40, 4)
    k0, v0 = k.copy(), v.copy()
    cases = [
        (lambda: fairkv.plan(k, ratio=1.0), "invalid argument", "ratio"),
        (lambda: fairkv.plan(k, ratio=0.5, budget=10), "invalid argument", "exactly one"),
        (lambda: fairkv.plan(k), "invalid argument", "exactly one"),
        (lambda: fairkv.plan(k, scorer="lru", ratio=0.5), "invalid argument", "unknown scorer"),
        (lambda: fairkv.plan(k, allocator="fair", segments=[(0, 10), (5, 20)], ratio=0.5), "overlapping segments", ""),
        (lambda: fairkv.plan(k, segments=[(0, 50)], ratio=0.5), "out of range", ""),
        (lambda: fairkv.plan(k, whitelist=list(range(30)), ratio=0.5), "budget exceeded", "whitelist"),
        (lambda: fairkv.plan(k, whitelist=[1.5], ratio=0.5), "invalid argument", "whitelist[0]"),
        (lambda: fairkv.plan(k, whitelist=7, ratio=0.5), "invalid argument", "whitelist must be a sequence"),
        (lambda: fairkv.plan(k, segments=5, ratio=0.5), "invalid argument", "segments must be a sequence"),
        (lambda: fairkv.plan(k, segments=[5], ratio=0.5), "invalid argument", "segments[0] must be a pair"),
        (lambda: fairkv.plan(k, segments=[(0, 10, 20)], ratio=0.5), "invalid argument", "segments[0] must be a pair"),
        (lambda: fairkv.plan(k, whitelist=[2**40], ratio=0.5), "out of range", "whitelist[0]"),
        (lambda: fairkv.plan(k.astype(np.float64), ratio=0.5), "invalid argument", "float32"),
        (lambda: fairkv.plan(k[0], ratio=0.5), "invalid shape", "4 dimensions"),
        (lambda: fairkv.plan(k[:, :, :0], ratio=0.5), "empty cache", "keys is empty"),
        (lambda: fairkv.plan(k[:, :0], ratio=0.5), "invalid shape", "keys is empty"),
        (lambda: fairkv.plan(k[:, :, ::-1], ratio=0.5), "invalid shape", "stride"),
        (lambda: fairkv.plan(np.broadcast_to(k[:, :1], (1, 2, 40, 4)), ratio=0.5), "invalid shape", "overlapping"),
        (lambda: fairkv.plan([[1.0]], ratio=0.5), "invalid argument", "numpy array"),
        (lambda: fairkv.plan(k, scores=np.zeros((1, 2, 40), np.float32), scorer="knorm", ratio=0.5),
         "invalid argument", "external"),
        (lambda: fairkv.plan(scores=np.zeros((1, 2, 40), np.float64), ratio=0.5), "invalid argument", "float32"),
        (lambda: fairkv.plan(k, selector="union_heads", allocator="fair_paper", segments=[(0, 10)], ratio=0.5),
         "invalid argument", "fair_paper"),
    ]
    for call, status, text in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert isinstance(e.value, fairkv.Error)
        assert e.value.status == status, (status, str(e.value))
        assert text in str(e.value)
    p = fairkv.plan(k, ratio=0.5)
    other = np.zeros((1, 3, 40, 4), np.float32)
    compact_cases = [
        (lambda: fairkv.compact(p, k, k), "overlap"),                   # K and V the same memory
        (lambda: fairkv.compact(p, k, other), "values"),                # heads differ from the plan's
        (lambda: fairkv.compact(p, k, v.astype(np.float16)), "dtype"),
        (lambda: fairkv.compact(p, k[:, :, :30], v[:, :, :30]), "keys"),  # fewer tokens than the plan
    ]
    buffer = np.zeros((1, 2, 41, 4), np.float32)
    compact_cases.append((lambda: fairkv.compact(p, buffer[:, :, :40], buffer[:, :, 1:]), "overlap"))
    ro = v.copy()
    ro.setflags(write=False)
    compact_cases.append((lambda: fairkv.compact(p, k, ro), "read-only"))
    for call, text in compact_cases:
        with pytest.raises(fairkv.Error) as e:
            call()
        assert text in str(e.value), str(e.value)
    np.testing.assert_array_equal(k, k0)
    np.testing.assert_array_equal(v, v0)
    assert not buffer.any()
    with pytest.raises(fairkv.Error):
        p.kept(0, 2)


def test_plans_from_several_threads_agree_with_serial_ones():
    # The GIL is released while the library works: concurrent calls must not interfere.
    r = rng(7)
    caches = [r.standard_normal((1, 4, 2000, 32), dtype=np.float32) for _ in range(4)]
    serial = [fairkv.plan(c, segments=[(10, 500), (500, 1500)], ratio=0.7).indices.copy() for c in caches]
    results = [None] * 4

    def work(i):
        results[i] = fairkv.plan(caches[i], segments=[(10, 500), (500, 1500)], ratio=0.7).indices.copy()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(serial, results):
        np.testing.assert_array_equal(a, b)


def test_attention_kernel_isa_follows_the_fairkv_cpu_isa_cap():
    # Read once per process, so each cap gets its own interpreter.
    def isa(cap):
        env = {k: v for k, v in os.environ.items() if k != "FAIRKV_CPU_ISA"}
        if cap is not None:
            env["FAIRKV_CPU_ISA"] = cap
        out = subprocess.run([sys.executable, "-c", "import fairkv; print(fairkv.attention_kernel_isa())"],
                             env=env, check=True, capture_output=True, text=True)
        return out.stdout.strip()

    floor, avx2, full, typo = isa("none"), isa("avx2"), isa(None), isa("avx-2")
    dispatched = ("avx2", "avx512")
    assert fairkv.attention_kernel_isa() == full
    assert typo == floor  # a value that is none of the names caps like `none`
    if floor not in dispatched:  # the module's own flags are below AVX2 (a default x86-64 build)
        assert avx2 in (floor, "avx2")  # avx2 where the CPU has it, never avx512
        assert full in (avx2, "avx512")


def test_a_plan_is_applied_once_a_second_compaction_is_refused_and_writes_nothing():
    k, v = indexed_cache(1, 2, 40, 4)
    p = fairkv.plan(k, ratio=0.5)
    assert not p.applied
    fairkv.compact(p, k, v)
    assert p.applied
    k1, v1 = k.copy(), v.copy()
    with pytest.raises(fairkv.Error) as e:
        fairkv.compact(p, k, v)  # would move already-compacted rows again
    assert e.value.status == "invalid plan" and "already applied" in str(e.value)
    np.testing.assert_array_equal(k, k1)
    np.testing.assert_array_equal(v, v1)
    # A fresh plan of the same cache compacts it again, from what it holds now.
    fairkv.compact(fairkv.plan(k, ratio=0.5), k, v)


def test_prioritized_takes_weights_and_floors_and_refuses_to_be_fair_in_disguise():
    k, _ = indexed_cache(1, 1, 40, 4)
    segs = [(4, 20), (20, 36)]
    # Weights 3 : 1 on two 16-token segments, no sinks: the 20 kept tokens split 15 / 5 (and 0 outside them,
    # whose weight is 0): in proportion to weight x size, hand-worked.
    p = fairkv.plan(k, segments=segs, priorities=[(3.0, 0.0), (1.0, 0.0)], remainder_priority=(0.0, 0.0), sinks=0,
                    budget=20)
    assert p.policy.endswith("prioritized")
    kept = p.kept(0, 0)
    assert ((kept >= 4) & (kept < 20)).sum() == 15
    assert ((kept >= 20) & (kept < 36)).sum() == 5
    # A floor of 1.0 keeps the second segment whole whatever its weight.
    p = fairkv.plan(k, segments=segs, priorities=[(3.0, 0.0), (1.0, 1.0)], remainder_priority=(0.0, 0.0), sinks=0,
                    budget=20)
    kept = p.kept(0, 0)
    assert ((kept >= 20) & (kept < 36)).sum() == 16
    cases = [
        (lambda: fairkv.plan(k, segments=segs, allocator="prioritized", ratio=0.5), "needs priorities"),
        (lambda: fairkv.plan(k, segments=segs, allocator="fair", priorities=[(1, 0), (1, 0)], ratio=0.5),
         "only by allocator 'prioritized'"),
        (lambda: fairkv.plan(k, segments=segs, priorities=[(1, 0)], ratio=0.5), "1 priorities were given for 2 segments"),
        (lambda: fairkv.plan(k, segments=segs, priorities=[(1, 0), 2], ratio=0.5), "priorities[1] must be a pair"),
        (lambda: fairkv.plan(k, segments=segs, priorities=[(1, 0), (True, 0)], ratio=0.5), "priorities[1].weight"),
        (lambda: fairkv.plan(k, segments=segs, priorities=[(1, 0), (-1.0, 0)], ratio=0.5), "weight must be finite"),
        (lambda: fairkv.plan(k, segments=segs, priorities=[(1, 0), (1, 1.5)], ratio=0.5), "floor"),
    ]
    for call, text in cases:
        with pytest.raises(fairkv.Error) as e:
            call()
        assert text in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype,text", [(">f4", "big-endian"), ("O", "dtype object"),
                                         (np.longdouble, "dtype float128")])
def test_arrays_of_an_unreadable_dtype_are_named_by_their_dtype(dtype, text):
    if np.dtype(dtype) == np.dtype(np.float64):
        pytest.skip("longdouble is float64 on this platform")
    k = np.zeros((1, 2, 8, 4), dtype=dtype)
    with pytest.raises(fairkv.Error) as e:
        fairkv.plan(k, ratio=0.5)
    assert text in str(e.value), str(e.value)
    assert "device" not in str(e.value)


def test_a_tensor_that_requires_grad_is_not_written_behind_autograds_back():
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test_python.sh installs it)")
    k = torch.randn(1, 2, 16, 4)
    v = torch.randn(1, 2, 16, 4, requires_grad=True)
    v0 = v.detach().clone()
    p = fairkv.plan(k, ratio=0.5)
    with pytest.raises(fairkv.Error) as e:
        fairkv.compact(p, k, v)
    assert "requires grad" in str(e.value) and ".detach()" in str(e.value)
    assert torch.equal(v.detach(), v0)
    assert not p.applied
    fairkv.compact(p, k, v.detach())  # the explicit way: the same memory, outside the graph
    assert not torch.equal(v.detach(), v0)
