"""benchmarks/real_teachers.py's re-cast at tiny size: a random BERT sentence-transformers folder (MiniLM's WordPiece
tokenizer and recipe, hidden 32, its token-type and position rows large enough to matter) re-cast as DistilBERT,
RoBERTa and MPNet gives sentence-transformers' vectors equal to the original's (the script's own check), and the check
refuses a re-cast whose positions are off by one."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # sentence-transformers and transformers loaded, six folders built and read

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_teachers.py"
SENTENCES = [
    "a gorgeous, witty, seductive movie.",
    "it 's a charming and often affecting journey.",
    "the plot is nothing but boilerplate clichés from start to finish,",
    "unflinchingly bleak and desperate",
]


@pytest.fixture(scope="module")
def real_teachers():
    spec = importlib.util.spec_from_file_location("real_teachers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_bert(real_teachers, tmp_path_factory):
    """A random BERT of MiniLM's vocabulary and tokenizer, as a sentence-transformers folder (mean pooling)."""
    import torch
    from transformers import BertConfig, BertModel

    source, folder = real_teachers.minilm(), tmp_path_factory.mktemp("tiny") / "bert"
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    model = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, initializer_range=0.3, **shape))
    real_teachers._st_files(source, folder, "a tiny random BERT for the re-cast's test")
    model.save_pretrained(folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    return folder


@pytest.mark.parametrize("kind", ["distilbert", "roberta", "mpnet"])
def test_a_recast_is_the_same_function(real_teachers, tiny_bert, tmp_path, kind):
    folder = real_teachers.recast(tiny_bert, kind, tmp_path / kind)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == kind and raw["architectures"] == [real_teachers.ARCHITECTURES[kind]]
    assert {"modules.json", "sentence_bert_config.json", "vocab.txt", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    } and (folder / "1_Pooling" / "config.json").is_file()
    assert real_teachers.check_recast(tiny_bert, folder, SENTENCES) > real_teachers.SAME


def test_the_check_refuses_positions_off_by_one(real_teachers, tiny_bert, tmp_path):
    """The check is what vouches for the table: a RoBERTa re-cast whose table starts one row early is refused."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = real_teachers.recast(tiny_bert, "roberta", tmp_path / "roberta")
    weights = load_file(folder / "model.safetensors")
    key = "embeddings.position_embeddings.weight"
    weights[key] = torch.roll(weights[key], -1, dims=0).contiguous()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SystemExit, match="not .*'s function: least cosine"):
        real_teachers.check_recast(tiny_bert, folder, SENTENCES)


def test_a_grown_bert_computes_the_original(real_teachers):
    """grow (twice the width, twice the depth) keeps a BERT's function: a random BERT (hidden 32, 4 heads of 8, 2
    layers, large weights) and its grown 64-wide, 4-layer copy give the same token vectors, twice side by side, and
    so the same mean-pooled ones, padding masked. Tolerance: float32 rounding through 2 extra layers and a wider sum
    (~1e-6 on values ~3); the inserted layers' LayerNorm eps (1e-12) is far below it."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    shape = dict(vocab_size=100, num_attention_heads=4, initializer_range=0.3)
    small = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64, **shape)).eval()
    big = BertModel(BertConfig(hidden_size=64, num_hidden_layers=4, intermediate_size=128, **shape)).eval()
    missing, unexpected = big.load_state_dict(real_teachers.grow(small.state_dict(), small.config.to_dict()))
    assert not missing and not unexpected
    assert torch.count_nonzero(big.encoder.layer[1].attention.self.query.weight) > 0  # the inserted layer computes
    ids, mask = torch.randint(0, 100, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        a = small(input_ids=ids, attention_mask=mask).last_hidden_state
        b = big(input_ids=ids, attention_mask=mask).last_hidden_state
    assert float(a.abs().max()) > 1  # the values are not all near zero, so the tolerance means something
    assert float((b - torch.cat([a, a], -1)).abs().max()) < 1e-4  # NaN compares false
    pooled = [(x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) for x in (a, b)]
    assert torch.allclose(pooled[1], torch.cat([pooled[0], pooled[0]], -1), atol=1e-4)
