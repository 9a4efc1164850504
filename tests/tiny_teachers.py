"""Tiny teachers of every encoder architecture, built offline: transformers' config classes (hidden 32, 2 layers)
with real tokenizers of each kind (WordPiece, byte-level BPE, Unigram) trained with ``tokenizers`` on the shared
WikiText-2 text, saved as sentence-transformers folders (sentence_transformers' own save) and as
``...ForSequenceClassification`` folders (SST-2's labels)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from sharebert.formats.paths import data_path

SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
VOCAB = 1000
POOL = 20_000  # SST-2 training rows a classifier teacher picks its shortest from
# model_type -> (config class, its extra fields, tokenizer kind, special tokens style)
ARCHITECTURES = {
    "bert": ("BertConfig", {}, "wordpiece", "bert"),
    "distilbert": ("DistilBertConfig", {}, "wordpiece", "bert"),
    "electra": ("ElectraConfig", {"embedding_size": 16}, "wordpiece", "bert"),
    "mpnet": ("MPNetConfig", {}, "wordpiece", "roberta"),
    "roberta": ("RobertaConfig", {}, "bpe", "roberta"),
    "modernbert": ("ModernBertConfig", {"global_attn_every_n_layers": 2, "local_attention": 16}, "bpe", "bert"),
    "xlm-roberta": ("XLMRobertaConfig", {}, "unigram", "roberta"),
    "albert": ("AlbertConfig", {"embedding_size": 16}, "unigram", "bert"),
    "deberta-v2": (
        "DebertaV2Config",
        {
            "relative_attention": True,
            "position_biased_input": False,
            "pos_att_type": ["p2c", "c2p"],
            "type_vocab_size": 0,
        },
        "unigram",
        "bert",
    ),
}
TOKEN_TYPES = ("bert", "electra", "albert", "deberta-v2")  # whose published tokenizers give token_type_ids
STYLES = {
    "bert": {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    },
    "roberta": {
        "bos_token": "<s>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
    },
}


def training_text(limit: int | None = None) -> list[str]:
    lines = [
        line.strip()
        for line in data_path("wikitext-2-raw", "wiki.valid.raw").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith(" =")
    ]
    return lines[:limit]


@cache
def backend_tokenizer(kind: str, style: str) -> str:
    """A ``tokenizers`` tokenizer of ``kind`` trained on the text, with ``style``'s special tokens and
    post-processing (as JSON: trained once per session)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    special = STYLES[style]
    names = list(
        dict.fromkeys(
            [
                special["pad_token"],
                special["unk_token"],
                special["cls_token"],
                special["sep_token"],
                special["mask_token"],
            ]
        )
    )
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=special["unk_token"]))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=names)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB, special_tokens=names, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=names, unk_token=special["unk_token"])
    tok.train_from_iterator(training_text(1000 if kind == "unigram" else 3000), trainer)  # Unigram trains slowly
    tok = _canonical(tok, len(names))
    cls, sep = special["cls_token"], special["sep_token"]
    ids = {t: tok.token_to_id(t) for t in (cls, sep)}
    if style == "roberta":
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}", special_tokens=list(ids.items())
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=list(ids.items())
        )
    return tok.to_str()


def _canonical(tok, specials: int):
    """The trained model with its tokens in one order whatever the process. ``tokenizers``' trainers walk hash maps
    seeded per process (huggingface/tokenizers#1794): WordPiece numbers its ``##`` pieces in that order (59 of 1,000
    ids moved between two runs here); Unigram sums its EM statistics in it (scores differ in their last bits, and
    near-equal pieces swap ids) and scores the characters it adds at the end ``min + k * 1e-4`` in it (14 ids
    moved). Each such move changes every teacher built on the tokenizer. So after the special tokens, WordPiece's
    tokens are sorted; Unigram's scores are rounded to 1e-9, the added characters' (single characters within
    ``n * 1e-4`` of the lowest score) set to the lowest, and its pieces sorted by (score, piece)."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    model = spec["model"]
    if model["type"] == "WordPiece":
        rest = sorted(model["vocab"], key=model["vocab"].get)[specials:]
        model["vocab"] = {
            **{t: i for t, i in model["vocab"].items() if i < specials},
            **{t: specials + i for i, t in enumerate(sorted(rest))},
        }
    elif model["type"] == "Unigram":
        rest = [[piece, round(score, 9)] for piece, score in model["vocab"][specials:]]
        low = min(score for _, score in rest)
        chars = [p for p in rest if len(p[0]) == 1]
        for p in chars:
            if p[1] <= low + 1e-4 * len(chars):
                p[1] = low
        model["vocab"] = model["vocab"][:specials] + sorted(rest, key=lambda p: (-p[1], p[0]))
    return Tokenizer.from_str(json.dumps(spec))


def make_tokenizer(kind: str, style: str, token_types: bool):
    """A transformers fast tokenizer of ``kind`` with ``style``'s special tokens and post-processing."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    inputs = ["input_ids", "token_type_ids", "attention_mask"] if token_types else ["input_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(backend_tokenizer(kind, style)),
        model_max_length=128,
        model_input_names=inputs,
        **STYLES[style],
    )


def make_config(model_type: str, tokenizer, **extra):
    import transformers

    name, fields, _, _ = ARCHITECTURES[model_type]
    ids = {
        k: getattr(tokenizer, f"{k.split('_')[0]}_token_id")
        for k in ("pad_token_id", "bos_token_id", "eos_token_id")
        if getattr(tokenizer, f"{k.split('_')[0]}_token_id") is not None
    }
    if model_type == "modernbert":
        ids.update(
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
    positions = 130 if ARCHITECTURES[model_type][3] == "roberta" else 128  # RoBERTa's, MPNet's: padding_idx + 1 offset
    return getattr(transformers, name)(
        **{"vocab_size": len(tokenizer), "max_position_embeddings": positions, **SHAPE, **fields, **ids, **extra}
    )


def build(root: Path, model_type: str) -> dict[str, Path]:
    """``{"embedding": folder, "classifier": folder}`` of a tiny ``model_type`` teacher under ``root``."""
    import transformers
    from sentence_transformers import SentenceTransformer, models

    base, tokenizer = _saved(transformers.AutoModel, model_type, root / f"{model_type}-base")
    word = models.Transformer(str(base), max_seq_length=64)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_embedding_dimension(), "mean"), models.Normalize()])
    st.save(str(root / f"{model_type}-st"))
    labels = {"num_labels": 2, "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    clf = root / f"{model_type}-clf"
    transformers.AutoModelForSequenceClassification.from_config(
        make_config(model_type, tokenizer, **labels)
    ).save_pretrained(clf)
    tokenizer.save_pretrained(clf)
    return {"embedding": root / f"{model_type}-st", "classifier": clf}


def trained_classifier(root: Path, model_type: str, steps: int = 150) -> Path:
    """A ``model_type`` SST-2 classifier a ShareBERT student can be built for (hidden 256; a 2,500-row word table, the
    tokenizer's 1,000 tokens first: a ShareBERT generates its layers' weights from its table, and ~1,800 rows are the
    fewest that source them), trained ``steps`` steps on SST-2's training rows (a plain PyTorch loop), so its
    predictions depend on the text. It trains on the ``steps * 32`` shortest of the first :data:`POOL` rows (SST-2's
    phrases, ~9 of RoBERTa's tokens a row against ~25 in file order): the 150 steps take about half the CPU (14 s
    against 30 s at load ~10), and the teacher still answers both labels (RoBERTa's: 'positive' for 82% of the first
    200 dev rows, as when it trained on the rows in file order)."""
    import torch
    import transformers

    from sharebert.training.glue import get_task, read_split

    _, _, kind, style = ARCHITECTURES[model_type]
    tokenizer = make_tokenizer(kind, style, model_type in TOKEN_TYPES)
    labels = {"num_labels": 2, "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(
        make_config(
            model_type,
            tokenizer,
            vocab_size=2500,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            **labels,
        )
    )
    split = read_split(get_task("sst2"), data_path("glue", "SST-2"), "train")
    texts, labels = list(split.text_a[:POOL]), list(split.labels[:POOL])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    model.train()
    for rows in _length_batches(tokenizer, texts, steps):
        batch = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=64, return_tensors="pt")
        loss = model(**batch, labels=torch.tensor([labels[i] for i in rows])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = root / f"{model_type}-sst2"
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _length_batches(tokenizer, texts: list[str], steps: int):
    """``steps`` batches of 32 indices of the shortest rows of ``texts``, each batch of rows of about one token
    length, in a fixed shuffled order: a batch pads to its longest row, and SST-2's rows in file order padded 2.5x
    their tokens (the teacher's time)."""
    import numpy as np

    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=64)["input_ids"]]
    batches = np.argsort(lengths, kind="stable")[: steps * 32].reshape(steps, 32)
    return batches[np.random.default_rng(0).permutation(steps)]


def masked_lm(root: Path, model_type: str) -> Path:
    """A tiny ``model_type`` teacher with its masked-LM head (``AutoModelForMaskedLM``), beside its tokenizer."""
    import transformers

    return _saved(transformers.AutoModelForMaskedLM, model_type, root / f"{model_type}-mlm")[0]


def _saved(auto_class, model_type: str, folder: Path):
    """A tiny ``model_type`` model of ``auto_class`` (seed 0) saved into ``folder`` beside its tokenizer;
    returns ``(folder, tokenizer)``."""
    import torch

    _, _, kind, style = ARCHITECTURES[model_type]
    tokenizer = make_tokenizer(kind, style, model_type in TOKEN_TYPES)
    torch.manual_seed(0)
    auto_class.from_config(make_config(model_type, tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer
