"""rlhf_ext's pure-torch flash_attn fallback, checked against flash-attn's documented behaviour."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlhf_ext.patches import flash_attn_fallback

flash_attn_fallback.install()
from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input  # noqa: E402
from flash_attn.utils.distributed import all_gather  # noqa: E402


def test_the_fallback_is_what_got_imported_here():
    import flash_attn

    # This environment has no real flash-attn (CPU), so the names must come from the fallback.
    assert not flash_attn_fallback.real_flash_attn_available()
    assert flash_attn_fallback.is_fallback(flash_attn)
    assert flash_attn.__file__.startswith(flash_attn_fallback.FALLBACK_DIR)


def test_unpad_input_hand_computed():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    assert indices.tolist() == [0, 1, 4, 5, 6]
    assert indices.dtype == torch.int64
    assert cu_seqlens.tolist() == [0, 2, 5, 5] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 3 and isinstance(max_seqlen, int)
    assert seqused.tolist() == [2, 3, 0] and seqused.dtype == torch.int32
    assert packed.tolist() == [[0, 1], [2, 3], [8, 9], [10, 11], [12, 13]]


def test_unpad_input_unused_mask_keeps_tokens_but_not_seqused():
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    unused = torch.tensor([[0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    hidden = torch.arange(6.0).reshape(2, 3, 1)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 3, 4]
    assert cu_seqlens.tolist() == [0, 2, 4]
    assert max_seqlen == 2
    assert seqused.tolist() == [1, 2]  # valid tokens only
    assert packed.flatten().tolist() == [0.0, 1.0, 3.0, 4.0]


def test_pad_input_inverts_unpad_and_zero_fills():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    hidden = torch.randn(3, 5, 2, 3)
    packed, indices, *_ = unpad_input(hidden, mask)
    restored = pad_input(packed, indices, 3, 5)
    assert restored.shape == hidden.shape
    keep = mask.bool()[..., None, None].expand_as(hidden)
    assert torch.equal(restored[keep], hidden[keep])
    assert torch.count_nonzero(restored[~keep]) == 0


def test_gradients_flow_like_scatter_and_gather():
    torch.manual_seed(1)
    x = torch.randn(6, 3, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    w = torch.randn(3, 3)
    (index_first_axis(x, idx) * w).sum().backward()
    expected = torch.zeros(6, 3)
    expected[idx] = w
    assert torch.equal(x.grad, expected)

    v = torch.randn(3, 3, requires_grad=True)
    out = pad_input(v, idx, 2, 3)  # rows 4, 0, 2 of a 2 x 3 grid
    g = torch.randn(2, 3, 3)
    (out * g).sum().backward()
    assert torch.equal(v.grad, g.reshape(6, 3)[idx])


def test_rearrange_is_einops():
    x = torch.arange(6).reshape(2, 3, 1)
    assert rearrange(x, "b s ... -> (b s) ...").shape == (6, 1)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="attention_mask"):
        unpad_input(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="at least 2 dims"):
        index_first_axis(torch.zeros(4), torch.tensor([0]))


def test_missing_kernels_still_raise_import_error():
    # OpenRLHF probes flash_attn.ops.triton.cross_entropy inside try/except ImportError.
    with pytest.raises(ImportError):
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss  # noqa: F401
    with pytest.raises(ImportError, match="fallback"):
        from flash_attn import flash_attn_varlen_func  # noqa: F401


def test_transformers_still_reports_no_flash_attention():
    from transformers.utils import is_flash_attn_2_available

    assert is_flash_attn_2_available() is False


def test_all_gather_single_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        x = torch.arange(4.0).reshape(2, 2).requires_grad_()
        y = all_gather(x, None)
        assert torch.equal(y, x)
        (y * 3).sum().backward()
        assert torch.equal(x.grad, torch.full((2, 2), 3.0))
    finally:
        dist.destroy_process_group()


ALL_GATHER_WORKER = textwrap.dedent(
    """
    import faulthandler, json, sys
    faulthandler.enable()  # a native abort still prints where Python was
    import torch, torch.distributed as dist
    from rlhf_ext.patches import flash_attn_fallback
    flash_attn_fallback.install()
    from flash_attn.utils.distributed import all_gather

    def gather_and_backward(rank):
        x = torch.full((2, 3), float(rank + 1), requires_grad=True)
        y = all_gather(x, dist.group.WORLD)
        # every rank weights the gathered rows differently; the input gradient is the sum over ranks
        w = torch.arange(12.0).reshape(4, 3) * (rank + 1)
        (y * w).sum().backward()
        return y.tolist(), x.grad.tolist()

    rank, path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2)
    # y's autograd node holds the process group, so the graph must be gone (the function returned)
    # before destroy_process_group: else gloo's worker threads outlive it and are torn down during
    # interpreter shutdown, which now and then aborts ("terminate called without an active exception")
    print(json.dumps(gather_and_backward(rank)), flush=True)
    dist.barrier()  # neither rank closes its connections while the other still uses them
    dist.destroy_process_group()
    """
)


def test_all_gather_two_ranks_concatenates_and_reduce_scatters_gradients(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(ALL_GATHER_WORKER)
    env = dict(os.environ)
    env.pop("RLHF_EXT_PLUGINS", None)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "pg")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for r in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"rank exit {p.returncode}\nstdout: {out}\nstderr: {err}"
    gathered = [[1.0] * 3] * 2 + [[2.0] * 3] * 2
    w = torch.arange(12.0).reshape(4, 3)
    summed = w * 1 + w * 2  # d/dy of sum over both ranks' losses
    for rank, (out, _) in enumerate(outs):
        y, grad = json.loads(out.strip())
        assert y == gathered
        assert grad == summed[2 * rank : 2 * rank + 2].tolist()


def test_real_flash_attn_wins_when_installed(tmp_path):
    fake = tmp_path / "site" / "flash_attn"
    (fake / "utils").mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    (fake / "bert_padding.py").write_text("def pad_input(*a):\n    return 'real'\n")
    code = textwrap.dedent(
        """
        from rlhf_ext.patches import flash_attn_fallback
        flash_attn_fallback.install()
        import flash_attn
        from flash_attn.bert_padding import pad_input
        print(getattr(flash_attn, "REAL", False), flash_attn_fallback.is_fallback(flash_attn), pad_input())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    env.pop("RLHF_EXT_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "real"]
