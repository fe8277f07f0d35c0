"""The recorder's output cache: which ops it takes, what it rebuilds, what it refuses, and that a
capture with it equals one without it byte for byte."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from capture.opcache import FUNCTIONAL, INPLACE, VIEW, OutputCache, kind

aten = torch.ops.aten


@pytest.mark.parametrize(
    "func, expected",
    [
        (aten.mm.default, FUNCTIONAL),
        (aten.native_layer_norm.default, FUNCTIONAL),  # a tuple of fresh tensors
        (aten.view.default, VIEW),
        (aten.slice.Tensor, VIEW),
        (aten._unsafe_view.default, VIEW),  # shares storage though its schema does not say so
        (aten.add_.Tensor, INPLACE),
        (aten.mm.out, None),  # writes an argument it does not take first
        (aten.nonzero.default, None),  # data-dependent output shape
        (aten.split.Tensor, None),  # a list of views
        (aten.as_strided_.default, None),  # changes its argument's metadata
        (aten.set_.source_Storage, None),
        (aten._local_scalar_dense.default, None),  # returns a Python number
    ],
)
def test_kinds(func, expected):
    assert kind(func) == expected


@pytest.fixture
def fake():
    mode = FakeTensorMode()
    with mode:
        a = torch.empty(4, 8)
        b = torch.empty(8, 16)
    return mode, a, b


def _call(cache, mode, func, *args, **kwargs):
    call = cache.key(func, args, kwargs)
    out = None if call is None else cache.lookup(call)
    if out is None:
        with mode:
            out = func(*args, **kwargs)
        if call is not None:
            cache.learn(call, func, out)
    return out


def test_a_functional_op_is_rebuilt_fresh_with_its_metadata(fake):
    mode, a, b = fake
    cache = OutputCache({})
    first = _call(cache, mode, aten.mm.default, a, b)
    second = _call(cache, mode, aten.mm.default, a, b)
    assert (cache.misses, cache.hits) == (1, 1)
    assert second.shape == (4, 16) and second.stride() == (16, 1) and second.dtype == torch.float32
    assert second.fake_mode is mode and second.fake_device == first.fake_device
    assert second.untyped_storage().nbytes() == 4 * 16 * 4
    storages = {t.untyped_storage()._cdata for t in (a, b, first)}
    assert second.untyped_storage()._cdata not in storages  # a new allocation, like the kernel's


def test_other_metadata_is_another_key(fake):
    mode, a, b = fake
    cache = OutputCache({})
    _call(cache, mode, aten.mm.default, a, b)
    out = _call(cache, mode, aten.mm.default, a.t().contiguous().t(), b)  # same shape, other strides
    assert (cache.misses, cache.hits) == (2, 0)
    assert out.shape == (4, 16)
    _call(cache, mode, aten.add.Tensor, a, 1)
    _call(cache, mode, aten.add.Tensor, a, 1.0)  # 1 and 1.0 hash alike
    assert cache.hits == 0


def test_where_an_input_starts_is_no_part_of_a_key_but_a_views_offset_follows_it(fake):
    """Two weights at distinct offsets of one flat buffer (DDP's): two keys for the slices (other
    bounds), one for the reshape, whose output starts where its input does (128), one for the
    GEMM, whose output is fresh, and one for an in-place op on either weight."""
    mode, a, _ = fake
    cache = OutputCache({})
    with mode:
        flat = torch.empty(3 * 8 * 16)
    w1, w2 = (_call(cache, mode, aten.view.default, _call(cache, mode, aten.slice.Tensor, flat, 0, o, o + 128),
                    [8, 16]) for o in (0, 128))
    assert (cache.misses, cache.hits) == (3, 1)
    assert (tuple(w2.shape), w2.stride(), w2.storage_offset()) == ((8, 16), (16, 1), 128)
    assert w2.untyped_storage()._cdata == flat.untyped_storage()._cdata
    _call(cache, mode, aten.mm.default, a, w1)
    out = _call(cache, mode, aten.mm.default, a, w2)
    assert cache.hits == 2 and out.shape == (4, 16) and out.storage_offset() == 0
    _call(cache, mode, aten.mul_.Tensor, w1, 2.0)
    assert _call(cache, mode, aten.mul_.Tensor, w2, 2.0) is w2 and cache.hits == 3


def test_a_slice_of_a_view_at_another_offset_shifts_by_the_same_amount(fake):
    """slice(x, 0, 1, 3) of a (4, 8) tensor starts 8 elements after x: at 8 for x at 0, at 40 for a
    row block of a buffer starting at 32; as_strided keeps its absolute offset and its key."""
    mode, _, _ = fake
    cache = OutputCache({})
    with mode:
        buf = torch.empty(8 * 8)
    x0 = _call(cache, mode, aten.view.default, _call(cache, mode, aten.slice.Tensor, buf, 0, 0, 32), [4, 8])
    x1 = _call(cache, mode, aten.view.default, _call(cache, mode, aten.slice.Tensor, buf, 0, 32, 64), [4, 8])
    hits = cache.hits
    s0 = _call(cache, mode, aten.slice.Tensor, x0, 0, 1, 3)
    s1 = _call(cache, mode, aten.slice.Tensor, x1, 0, 1, 3)
    assert cache.hits == hits + 1 and (s0.storage_offset(), s1.storage_offset()) == (8, 40)
    assert (tuple(s1.shape), s1.stride()) == ((2, 8), (8, 1))
    a0 = _call(cache, mode, aten.as_strided.default, x0, [2, 2], [1, 1], 4)
    a1 = _call(cache, mode, aten.as_strided.default, x1, [2, 2], [1, 1], 4)
    assert cache.hits == hits + 1 and a0.storage_offset() == a1.storage_offset() == 4


def test_a_view_shares_its_arguments_storage_at_its_offset(fake):
    mode, a, _ = fake
    cache = OutputCache({})
    _call(cache, mode, aten.slice.Tensor, a, 0, 1, 3)
    with mode:
        c = torch.empty(4, 8)
    v = _call(cache, mode, aten.slice.Tensor, c, 0, 1, 3)
    assert cache.hits == 1
    assert v.untyped_storage()._cdata == c.untyped_storage()._cdata
    assert (tuple(v.shape), v.stride(), v.storage_offset()) == ((2, 8), (8, 1), 8)


def test_an_in_place_op_returns_its_argument(fake):
    mode, a, _ = fake
    cache = OutputCache({})
    _call(cache, mode, aten.mul_.Tensor, a, 2.0)
    with mode:
        c = torch.empty(4, 8)
    assert _call(cache, mode, aten.mul_.Tensor, c, 2.0) is c
    assert cache.hits == 1


def test_a_constructor_is_keyed_by_its_mode_and_default_device(fake):
    mode, _, _ = fake
    cache = OutputCache({})
    with mode:
        first = _call(cache, mode, aten.zeros.default, [3, 5], dtype=torch.bfloat16, device="cpu")
        again = _call(cache, mode, aten.zeros.default, [3, 5], dtype=torch.bfloat16, device="cpu")
    assert cache.hits == 1
    assert (tuple(again.shape), again.stride(), again.dtype) == ((3, 5), (5, 1), torch.bfloat16)
    assert again.fake_mode is mode and again.fake_device == first.fake_device
    assert again.untyped_storage()._cdata != first.untyped_storage()._cdata


def test_an_undefined_output_stays_undefined(fake):
    mode, a, _ = fake
    cache = OutputCache({})
    with mode:
        w, bias = torch.empty(8), torch.empty(8)
        _, mean, rstd = aten.native_layer_norm.default(a, [8], w, bias, 1e-5)
    args = (a, a, [8], mean, rstd, w, bias, [True, False, False])
    first = _call(cache, mode, aten.native_layer_norm_backward.default, *args)
    again = _call(cache, mode, aten.native_layer_norm_backward.default, *args)
    assert cache.hits == 1
    assert [t is None for t in first] == [t is None for t in again] == [False, True, True]
    assert again[0].shape == (4, 8)


def test_refused_calls(fake):
    mode, a, b = fake
    cache = OutputCache({})
    assert cache.key(aten.mm.default, (a, torch.ones(8, 16)), {}) is None  # a real tensor
    assert cache.key(aten.empty.memory_format, ([4],), {}) is None  # a constructor outside a fake mode
    assert cache.key(aten.view.default, (a, [32]), {}) is not None
    assert cache.key(aten.add.Tensor, (a, object()), {}) is None  # an argument it cannot hash
    assert cache.key(aten.split.Tensor, (a, 2), {}) is None
    with FakeTensorMode() as other:
        c = torch.empty(8, 16)
    assert cache.key(aten.mm.default, (a, c), {}) is None  # two fake modes


def test_an_output_on_an_inputs_storage_is_not_learnt(fake):
    mode, a, b = fake
    cache = OutputCache({})
    call = cache.key(aten.mm.default, (a, b), {})
    cache.learn(call, aten.mm.default, a)  # as if the kernel had returned its input
    assert cache.lookup(call) is None


def test_a_capture_is_the_same_with_and_without_it():
    """Two pipeline stages of a tiny Megatron-style job (TP2 PP2 with interleaving, sequence
    parallelism, distributed optimizer with overlapped reductions): rank JSON byte-identical with the
    cache and with every call sent through FakeTensorMode; hundreds of calls answered by the cache."""
    from capture_script import ROOT
    from heterosim.forkpool import run_forked

    args = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--max-position-embeddings", "32", "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
            "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather", "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16"]

    def capture(job):
        rank, cached = job
        from capture.api import rank_json
        import capture.opcache as opcache

        counted = [0, 0]
        lookup = opcache.OutputCache.lookup

        def counting(self, call):
            out = lookup(self, call) if cached else None
            counted[out is None] += 1
            return out

        opcache.OutputCache.lookup = counting
        text = rank_json(str(ROOT / "models" / "pretrain_gpt.py"), args, rank, 8, 8)
        return text, counted

    jobs = [(r, c) for r in (0, 4) for c in (True, False)]
    (on0, hits0), (off0, none0), (on4, hits4), (off4, none4) = run_forked(jobs, capture, jobs=2)
    assert on0 == off0 and on4 == off4
    assert hits0[0] > 200 and hits4[0] > 200  # ops repeated within a rank (a layer's, the model build's)
    assert none0[0] == none4[0] == 0


def test_what_a_worker_learnt_reaches_its_parent(fake):
    """A worker's entries cross the pipe with operators by name (an OpOverload does not pickle) and
    land in the parent's process-wide entries, where ranks or cases forked next find them."""
    import pickle

    from capture import opcache
    from heterosim.validation.validate import _learnt

    mode, a, b = fake
    opcache.start_exporting()
    cache = OutputCache()  # the process's entries
    _call(cache, mode, aten.mm.default, a, b)
    sent = pickle.loads(pickle.dumps(opcache.exported()))
    assert [name for name, _, _ in sent] == ["aten.mm.default"]
    key = (aten.mm.default, *sent[0][1])
    del opcache.LEARNT[key]  # as in a parent that never saw it
    opcache.start_exporting()
    assert _learnt(0, ("result", sent)) == "result"
    assert opcache.LEARNT[key] == sent[0][2]
    assert opcache.exported() == sent  # a case's process passes its workers' entries on up
    again = OutputCache()
    _call(again, mode, aten.mm.default, a, b)
    assert again.hits == 1


def test_memory_formats_pickle_by_a_name_every_process_resolves():
    """Exported keys hold memory formats; pickled by qualified name, pickle would resolve
    'torch.contiguous_format' through whichever loaded module reaches it first (a script's
    __main__), which the parent then cannot import."""
    import pickle

    import capture.opcache  # noqa: F401 -- registers the reducer

    for m in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format):
        data = pickle.dumps(m)
        assert pickle.loads(data) is m and b"capture.opcache" in data and b"__main__" not in data
