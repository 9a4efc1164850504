"""Config validation, presets and the `sharebert build` command."""

import json

import pytest

from sharebert import PRESETS, ShareBertConfig, ShareBertForMaskedLM
from sharebert.formats.build import config_for_vocab
from sharebert.model.shape import parse_overrides
from sharebert_runtime.main import main


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(hidden_size=100, num_attention_heads=3), ["not divisible by num_attention_heads 3"]),
        (dict(qk_share_ratio=1.5, attention="partial-qk"), ["qk_share_ratio must lie in [0, 1]"]),
        (dict(attention="sparse"), ["attention='sparse'", "standard, symmetric"]),
        (
            dict(sharing="eps", embedding_size=64, hidden_size=768, intermediate_size=3072, num_attention_heads=12),
            ["column budget exceeded", "short by", "veps"],
        ),
        (dict(sharing="none", pooler="generated"), ["pooler='generated' needs sharing"]),
        (dict(sharing="veps", embedding_size=None), ["embedding_size smaller than hidden_size"]),
        (dict(classifier_pooling="avg"), ["classifier_pooling='avg' is not one of cls, mean"]),
    ],
)
def test_invalid_configs_fail_at_build_time_with_the_fix(kwargs, words):
    with pytest.raises(ValueError) as e:
        ShareBertConfig(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'sharebert-huge'.*sharebert-small"):
        ShareBertConfig.from_preset("sharebert-huge")


def test_vocab_smaller_than_the_tokenizer_is_refused():
    with pytest.raises(ValueError, match="smaller than the tokenizer's 30522 tokens"):
        config_for_vocab("sharebert-tiny", {"vocab_size": 30000}, 30522)
    assert config_for_vocab("sharebert-tiny", {}, 30522).vocab_size == 30528  # padded to a multiple of 8


def test_every_preset_is_valid_and_the_paper_shapes_hold():
    for name in PRESETS:
        ShareBertConfig.from_preset(name)
    small = ShareBertConfig.from_preset("sharebert-small")
    plan = small.column_plan()
    # Q, K, V, O, pooler: ceil(2048^2 / 30528) = 138; FF in/out: ceil(2048*4096 / 30528) = 275.
    assert [s.num_columns for s in plan.slots] == [138, 138, 138, 275, 275, 138, 138]
    assert plan.columns_used == 1240 and plan.generated_params == 5 * 2048**2 + 2 * 2048 * 4096
    assert ShareBertConfig.from_preset("bert-base-symmetric").attention == "symmetric"
    assert ShareBertConfig.from_preset("sharebert-tiny", attention="shared-qkv").attention == "shared-qkv"


def test_config_json_round_trip(tmp_path):
    c = ShareBertConfig.from_preset("sharebert-tiny", attention="partial-qk", qk_share_ratio=0.25)
    c.save_pretrained(tmp_path)
    back = ShareBertConfig.from_pretrained(tmp_path)
    drop = {"_name_or_path"}
    assert {k: v for k, v in back.to_dict().items() if k not in drop} == {
        k: v for k, v in c.to_dict().items() if k not in drop
    }


@pytest.mark.parametrize(
    "override,words",
    [
        (dict(classifier_pooling="avg"), "classifier_pooling='avg' is not one of cls, mean"),
        (dict(pooler="bogus"), "pooler='bogus' is not one of"),
        (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    ],
)
def test_from_pretrained_keyword_overrides_are_validated(tmp_path, override, words):
    """transformers sets from_pretrained's keyword overrides after __init__ validated the folder's values."""
    ShareBertConfig.from_preset("sharebert-tiny").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=words):
        ShareBertConfig.from_pretrained(tmp_path, **override)
    with pytest.raises(ValueError, match=words):
        ShareBertForMaskedLM.from_pretrained(tmp_path, **override)
    assert ShareBertConfig.from_pretrained(tmp_path, classifier_pooling="mean").classifier_pooling == "mean"


def test_parse_overrides_types():
    assert parse_overrides(
        [
            "hidden_size=1",
            "qk_share_ratio=0.5",
            "is_decoder=true",
            "embedding_size=none",
            "attention=symmetric",
            "num-hidden-layers=2",
        ]
    ) == {
        "hidden_size": 1,
        "qk_share_ratio": 0.5,
        "is_decoder": True,
        "embedding_size": None,
        "attention": "symmetric",
        "num_hidden_layers": 2,
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["oops"])
    # "none" is a value of the string fields that allow it, Python's None elsewhere
    assert parse_overrides(["sharing=none", "pooler=none", "pooler_activation=none", "share_layers=none"]) == {
        "sharing": "none",
        "pooler": "none",
        "pooler_activation": "none",
        "share_layers": None,
    }


@pytest.mark.parametrize(
    "item, message",
    [
        ("num_hiden_layers=3", "num_hiden_layers: not a config field; did you mean num_hidden_layers"),
        ("atention=symmetric", "did you mean attention"),
        ("zzz=1", "known fields: attention"),
    ],
)
def test_parse_overrides_refuses_unknown_fields(item, message):
    """A typo in --set is an error, never a field stored and ignored."""
    with pytest.raises(ValueError, match=message):
        parse_overrides([item])


def test_build_command_writes_a_ready_to_train_folder(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["build", "--preset", "sharebert-tiny", "--set", "num_hidden_layers=2", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "sharebert" and config["vocab_size"] == 30528 and config["num_hidden_layers"] == 2
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    model = ShareBertForMaskedLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    text = capsys.readouterr().out
    assert "learned parameters" in text
    # An existing folder is not overwritten by accident; bad input is a message, not a traceback.
    assert main(["build", "--preset", "sharebert-tiny", "--out", str(out)]) == 2
    assert main(["build", "--preset", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "already holds a model" in err and "unknown preset 'nope'" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
