"""The pooling modes have one list, ``sharebert_runtime.pooling.POOLING_MODES``: every consumer accepts exactly it
(the recipe, its sentence-transformers names, the export's pooling graph, the artifact check, ``predict --pooling``,
``serve``), or exactly the stated subset the model's torch ``pool`` computes (a classifier's reading, embedding
distillation's teacher)."""

import argparse

import numpy as np
import pytest

from sharebert_runtime.pooling import POOLING_MODES, check_mode, pool

NOT_MODES = ["median", "MEAN", "", None, ["mean"]]
SAYS = f"pooling must be one of {', '.join(POOLING_MODES)}, got "


def _states(seed: int = 0):
    """Token states (3, 5, 4) and a right-padded mask with one row of a single token."""
    rng = np.random.default_rng(seed)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], np.int64)
    return rng.normal(size=(3, 5, 4)).astype(np.float32), mask


@pytest.mark.parametrize("mode", NOT_MODES)
def test_anything_else_is_refused_in_one_line_naming_the_modes(mode):
    from sharebert.formats.recipe import EmbeddingRecipe

    for refuse in (check_mode, lambda m: pool(*_states(), m), lambda m: EmbeddingRecipe(m, False)):
        with pytest.raises(ValueError) as e:
            refuse(mode)
        assert str(e.value) == SAYS + repr(mode)


def test_the_recipe_takes_every_mode_by_sentence_transformers_names():
    from sharebert.formats import recipe

    assert all(recipe.EmbeddingRecipe(mode, False).pooling == mode for mode in POOLING_MODES)
    assert sorted(recipe._ST_MODES.values()) == sorted(POOLING_MODES)  # pooling_mode strings, one per mode
    assert sorted(recipe._ST_LEGACY_KEYS.values()) == sorted(POOLING_MODES)  # the boolean keys, one per mode


def test_predict_serve_and_the_artifact_check_offer_exactly_the_modes():
    from sharebert_runtime import cli, serve
    from sharebert_runtime.artifact import _check_embedding

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    (action,) = (a for a in parser._actions if "--pooling" in a.option_strings)
    assert tuple(action.choices) == POOLING_MODES
    assert ("pooling", POOLING_MODES) in serve.params("feature-extraction", 5)

    def bad(field, message):
        raise ValueError(f"{field}: {message}")

    for mode in POOLING_MODES:
        _check_embedding({"pooling": mode, "normalize": False, "output": "sentence_embedding"}, bad)
    with pytest.raises(ValueError, match=f"pooling 'median' is not one of {', '.join(POOLING_MODES)}"):
        _check_embedding({"pooling": "median", "normalize": False, "output": "sentence_embedding"}, bad)


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_the_exported_pooling_graph_pools_as_the_runtime(mode):
    """The export's nodes for each mode, run by ONNX Runtime, give the runtime's numpy pooling."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from sharebert.export.sentence_embedding import OUTPUT, add_sentence_embedding
    from sharebert.formats.recipe import EmbeddingRecipe

    graph = helper.make_graph(
        [helper.make_node("Identity", ["states"], ["last_hidden_state"])],
        "states",
        [
            helper.make_tensor_value_info("states", TensorProto.FLOAT, ["batch_size", "sequence_length", 4]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "sequence_length"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch_size", "sequence_length", 4])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    add_sentence_embedding(proto, EmbeddingRecipe(mode, False), [], 17)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    hidden, mask = _states()
    (got,) = session.run([OUTPUT], {"states": hidden, "attention_mask": mask})
    assert np.abs(got - pool(hidden, mask, mode)).max() <= 1e-6


def test_the_torch_pool_computes_a_stated_subset_as_the_runtime_and_refuses_the_rest():
    import torch

    from sharebert.model.modeling_sharebert import TORCH_POOLING
    from sharebert.model.modeling_sharebert import pool as torch_pool
    from sharebert.model.shape import CHOICES
    from sharebert.training import distill_embedding_setup

    assert set(TORCH_POOLING) < set(POOLING_MODES)
    assert set(CHOICES["classifier_pooling"]) <= set(TORCH_POOLING)  # a classifier reads [CLS] or the mean
    hidden, mask = _states()
    for mode in TORCH_POOLING:
        got = torch_pool(torch.from_numpy(hidden), torch.from_numpy(mask), mode).numpy()
        assert np.abs(got - pool(hidden, mask, mode)).max() <= 1e-6, mode
    for mode in set(POOLING_MODES) - set(TORCH_POOLING):
        with pytest.raises(ValueError) as e:
            torch_pool(torch.from_numpy(hidden), torch.from_numpy(mask), mode)
        assert str(e.value) == f"pooling {mode!r} is not supported ({', '.join(TORCH_POOLING)})"
    assert distill_embedding_setup.TORCH_POOLING is TORCH_POOLING  # the teacher is refused by this list


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    """A tiny transformers BERT folder with its tokenizer, no sentence-transformers files yet."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from sharebert.formats.paths import default_vocab

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    folder = tmp_path_factory.mktemp("teacher")
    BertModel(config).save_pretrained(folder)
    BertTokenizerFast(str(default_vocab())).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_embedding_distillation_takes_a_teacher_exactly_when_the_torch_pool_computes_its_mode(teacher_folder, mode):
    from sharebert.formats.recipe import EmbeddingRecipe, write_recipe
    from sharebert.model.modeling_sharebert import TORCH_POOLING
    from sharebert.training.distill_embedding_setup import _read_teacher

    write_recipe(teacher_folder, EmbeddingRecipe(mode, False), [])
    if mode in TORCH_POOLING:
        assert _read_teacher(teacher_folder).recipe.pooling == mode
    else:
        with pytest.raises(ValueError) as e:
            _read_teacher(teacher_folder)
        assert str(e.value) == (
            f"the teacher pools by {mode!r}; embedding distillation supports {', '.join(TORCH_POOLING)}"
        )
