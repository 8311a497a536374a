"""vLLM's batch as the core's keys (host-free): rails from block tables, windows that never reach the null blocks
vLLM leaves behind a moving window, the decode page table passed through, padding slots sent to the null block."""

import pytest
import torch

from sglang_inkling_backend.hosts.vllm.batch import VllmBatch, padded_slots
from sglang_inkling_backend.rails import block_table_token_table

BS = 16


def batch(query_lens, seq_lens, block_table, num_decodes, max_seq_len=None):
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    return VllmBatch(num_reqs=len(query_lens), num_actual_tokens=int(qsl[-1]), num_decodes=num_decodes,
                     num_decode_tokens=num_decodes, query_start_loc=qsl,
                     seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                     block_table=torch.tensor(block_table, dtype=torch.int32),
                     slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64), block_size=BS,
                     max_seq_len=max_seq_len or max(seq_lens))


def test_token_table_from_block_table():
    table = block_table_token_table(torch.tensor([[3, 1]], dtype=torch.int32), 4)
    assert table.tolist() == [[12, 13, 14, 15, 4, 5, 6, 7]]
    with pytest.raises(TypeError, match="block_table must be a 2-D int32/int64"):
        block_table_token_table(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        block_table_token_table(torch.tensor([[1]], dtype=torch.int32), 0)


def test_decode_rails_and_window_skip_the_null_blocks():
    # Request 0 (decode): 40 keys in blocks 5, 6, 7; a window of 10 sees positions 30..39 (blocks 1 and 2 of the
    # request), so vLLM has already replaced its first block with the null block 0.
    # Request 1 (prefill of 3 new tokens after 17 cached): 20 keys in blocks 2, 9.
    b = batch([1, 3], [40, 20], [[0, 6, 7], [2, 9, 0]], num_decodes=1)
    full = b.decode_rails(None)
    assert full.indptr.tolist() == [0, 40]
    window = b.decode_rails(10)
    assert window.indices.tolist() == [6 * BS + 14, 6 * BS + 15] + [7 * BS + i for i in range(8)]
    assert all(int(s) >= BS for s in window.indices)  # nothing in the null block
    rails, qo = b.prefill_rails(4)
    # queries at positions 17..19 see keys 14..19 with a window of 4 (distance <= 3)
    assert qo.tolist() == [0, 3]
    assert rails.indices.tolist() == [2 * BS + 14, 2 * BS + 15, 9 * BS + 0, 9 * BS + 1, 9 * BS + 2, 9 * BS + 3]
    assert b.decode_rails(10) is window  # one gather per window and step


def test_decode_pages_are_vllms_block_table_with_padding_rows_read_as_one_key():
    b = batch([1, 1, 0], [40, 3, 0], [[5, 6, 7], [2, 0, 0], [9, 9, 9]], num_decodes=3)  # row 2: graph padding
    pages = b.decode_pages()
    assert pages.page_table.data_ptr() == b.block_table.data_ptr() and pages.page_size == BS
    assert pages.seq_lens.tolist() == [40, 3, 1]
    b.seq_lens[0] = 41  # vLLM refills its persistent buffers between CUDA-graph replays
    assert b.decode_pages().seq_lens.tolist() == [41, 3, 1]


def test_padding_slots_go_to_the_null_block():
    assert padded_slots(torch.tensor([-1, 5, 130, -1])).tolist() == [0, 5, 130, 0]


def test_inconsistent_batches_are_refused():
    with pytest.raises(ValueError, match="num_decodes must lie in"):
        batch([1], [4], [[1]], num_decodes=2)
    with pytest.raises(ValueError, match="block_table must be"):
        batch([1, 1], [4, 4], [[1]], num_decodes=2)


def test_layer_attention_refuses_a_cache_that_is_not_vllms_view():
    import math

    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    from sglang_inkling_backend.layer_plan import LayerSpec

    spec = LayerSpec(num_q_heads=2, num_kv_heads=1, head_dim=32, softmax_scale=1 / math.sqrt(32))
    with pytest.raises(ValueError, match=r"4-D per-layer view \[num_blocks, H, N, C\], got \(10,\)"):
        LayerAttention(spec, "bf16", torch.bfloat16).paged_kv(torch.zeros(10))


def good_batch_args():
    return dict(num_reqs=2, num_actual_tokens=4, num_decodes=1, num_decode_tokens=1,
                query_start_loc=torch.tensor([0, 1, 4], dtype=torch.int32),
                seq_lens=torch.tensor([5, 3], dtype=torch.int32),
                block_table=torch.tensor([[1], [2]], dtype=torch.int32),
                slot_mapping=torch.zeros(4, dtype=torch.int64), block_size=BS, max_seq_len=5)


@pytest.mark.parametrize("change, error, match", [
    (dict(num_actual_tokens=-1), ValueError, r"num_actual_tokens must be an int >= 0, got -1"),
    (dict(num_actual_tokens=0), ValueError, r"num_actual_tokens 0 cannot hold 1 prefills of at least one token"),
    (dict(num_reqs=True), TypeError, r"num_reqs must be an int, got True"),
    (dict(block_size=16.0), TypeError, r"block_size must be an int"),
    (dict(max_seq_len=0), ValueError, r"max_seq_len must be an int >= 1"),
    (dict(query_start_loc=torch.tensor([0, 1])), ValueError,
     r"query_start_loc must be at least 3 entries long, one per request and one more"),
    (dict(seq_lens=torch.tensor([5.0, 3.0])), TypeError, r"seq_lens must be a 1-D int32/int64 tensor, got "
                                                         r"torch.float32"),
    (dict(block_table=torch.tensor([1, 2], dtype=torch.int32)), TypeError, r"block_table must be a 2-D int32/int64"),
    (dict(slot_mapping=torch.zeros(3, dtype=torch.int64)), ValueError,
     r"slot_mapping must be at least 4 entries long, one per token \(num_actual_tokens\)"),
])
def test_a_malformed_batch_is_refused_at_construction(change, error, match):
    VllmBatch(**good_batch_args())  # the unchanged batch is fine
    with pytest.raises(error, match=match):
        VllmBatch(**{**good_batch_args(), **change})
