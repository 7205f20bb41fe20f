import numpy as np
import pytest
import torch
from train_helpers import make_labels, make_store, tiny_config

from rpt.data.store import TokenStore
from rpt.training.data import (
    PAD_ID,
    BatchStream,
    LabelMismatch,
    SequenceDataset,
    check_labels,
    open_store,
    sequence_index,
)


def test_sequence_index_cuts_spans_from_each_document_start():
    idx = sequence_index(np.array([160, 192, 24, 112, 64]), seq_len=64, min_len=32)
    assert idx.tolist() == [[0, 0, 64], [0, 64, 64], [0, 128, 32],  # last partial span = 2 segments: kept
                            [1, 0, 64], [1, 64, 64], [1, 128, 64],
                            # doc 2 (24 tokens < 2 segments) dropped
                            [3, 0, 64], [3, 64, 48],
                            [4, 0, 64]]
    assert sequence_index(np.array([64 + 31]), 64, 32).tolist() == [[0, 0, 64]]  # a 31-token tail is dropped


def test_partial_sequence_is_right_padded_with_a_loss_mask(corpus):
    store = open_store(corpus["root"])
    ds = SequenceDataset(store, 64, 8, 16)
    b = ds.collate([2, 7])  # (doc 0, tokens 128..160) and (doc 3, tokens 64..112)
    assert b.input_ids.shape == (2, 64) and b.loss_mask.dtype == torch.bool
    assert b.loss_mask[0].sum() == 32 and b.loss_mask[1].sum() == 48
    assert (b.input_ids[0, 32:] == PAD_ID).all() and not b.loss_mask[0, 32:].any()
    assert b.input_ids[1, :48].tolist() == store.document(3)[64:112].tolist()


def test_labels_become_sequence_relative(corpus):
    store = open_store(corpus["root"])
    labels = make_labels(corpus["lengths"], 64, 8, 16, k=4)
    # doc 1's second sequence starts at chunk 8; its query chunk 7 (document chunk 15) may retrieve chunks 0..2 of
    # the sequence. Plant candidates: chunk 3 lies in the previous sequence, chunk 12 (= 4) is not retrievable
    row = labels.chunk_offsets[1] + 15
    labels.candidates[row] = [9, 3, 8, 12]
    labels.target[row] = [0.5, 2.0, -1.0, 3.0]
    ds = SequenceDataset(store, 64, 8, 16, labels)
    cand, bm25, target = ds.labels_of(4)  # sequence 4 = (doc 1, tokens 64..128)
    assert cand.shape == (8, 4)
    assert cand[7].tolist() == [1, -1, 0, -1]
    assert target[7].tolist() == [0.5, 2.0, -1.0, 3.0]  # values stay aligned; the -1 ids mask them
    # query chunks of the first two segments retrieve nothing
    assert (cand[:4] == -1).all()
    # every kept candidate is retrievable and earlier than its query
    q = np.arange(8)[:, None]
    kept = cand >= 0
    assert (cand[kept] <= ((q // 2 - 1) * 2 - 2).repeat(4, 1)[kept]).all()


def test_labels_of_a_partial_sequence_stop_at_the_document_end(corpus):
    store = open_store(corpus["root"])
    ds = SequenceDataset(store, 64, 8, 16, make_labels(corpus["lengths"], 64, 8, 16))
    cand, _, _ = ds.labels_of(2)  # doc 0, tokens 128..160: 4 real chunks (s0 = 16) of 8
    assert (cand[4:] == -1).all()


def test_stream_is_deterministic_sharded_and_resumable(corpus):
    store = open_store(corpus["root"])
    ds = SequenceDataset(store, 64, 8, 16)
    n = len(ds)
    one = BatchStream(ds, batch_size=2, grad_accum=2, seed=3)
    steps = [torch.cat([b.index for b in one.next_step()]).tolist() for _ in range(5)]
    # epochs are permutations: the first n positions cover every sequence once
    flat = sum(steps, [])
    assert sorted(flat[:n]) == list(range(n)) and sorted(flat[n : 2 * n]) == list(range(n))
    # two ranks x one micro-batch of 2 = the same global batches
    ranks = [BatchStream(ds, batch_size=2, grad_accum=1, rank=r, world_size=2, seed=3) for r in range(2)]
    for s in range(5):
        got = sorted(sum((r.next_step()[0].index.tolist() for r in ranks), []))
        assert got == sorted(steps[s])
    # resume: a new stream loaded with the state after 2 steps yields steps 3..5
    again = BatchStream(ds, batch_size=2, grad_accum=2, seed=3)
    again.load_state_dict({"consumed": 8, "seed": 3, "n_sequences": n})
    assert [torch.cat([b.index for b in again.next_step()]).tolist() for _ in range(3)] == steps[2:]
    other_seed = BatchStream(ds, batch_size=2, grad_accum=2, seed=4)
    assert [torch.cat([b.index for b in other_seed.next_step()]).tolist() for _ in range(5)] != steps


@pytest.mark.parametrize("change, message", [
    ({"tokenizer": {"name": "gpt2", "hash": "other", "vocab_size": 64}}, "tokenizer"),
    ({"chunk_size": 16}, "chunk_size"),
    ({"segment_len": 32}, "segment_len"),
    ({"span": "doc"}, "span"),
    ({"kind": "lex"}, "kind"),
])
def test_mismatched_labels_are_refused(corpus, change, message):
    cfg = tiny_config(corpus["tmp"])
    store = TokenStore.open(corpus["store"])
    labels = make_labels(corpus["lengths"], 64, 8, 16)
    check_labels(labels, store, cfg)  # the matching ones pass
    labels.manifest.update(change)
    with pytest.raises(LabelMismatch, match=message):
        check_labels(labels, store, cfg)


def test_labels_of_another_store_are_refused(corpus, tmp_path):
    cfg = tiny_config(corpus["tmp"])
    labels = make_labels(corpus["lengths"], 64, 8, 16)
    other = TokenStore.open(make_store(tmp_path / "other", [64, 64]))
    with pytest.raises(LabelMismatch, match="cover documents"):
        check_labels(labels, other, cfg)
    longer = TokenStore.open(make_store(tmp_path / "longer", [x + 64 for x in corpus["lengths"]]))
    with pytest.raises(LabelMismatch, match="labelled chunks"):
        check_labels(labels, longer, cfg)
    bigger = TokenStore.open(make_store(tmp_path / "bigger", corpus["lengths"] + [64]))
    with pytest.raises(LabelMismatch, match="merge the shards"):  # labels of a shard: only some documents
        check_labels(labels, bigger, cfg)
