"""DistilBERT student initialised from every other layer of a BERT teacher."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.config import ModelConfig
from bertforge.distillation import student_from_teacher
from bertforge.errors import BertforgeError
from bertforge.model.heads import PreTrainingModel

TEACHER = ModelConfig(vocab_size=80, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=32)


def test_student_takes_every_other_layer_and_loads_in_transformers(tmp_path):
    torch.manual_seed(0)
    teacher = PreTrainingModel(TEACHER).eval()
    student = student_from_teacher(teacher).eval()
    assert student.config.model_type == "distilbert" and student.config.num_hidden_layers == 2
    assert student.bert.embeddings.token_type_embeddings is None and student.bert.pooler is None
    t_layers, s_layers = teacher.bert.encoder.layer, student.bert.encoder.layer
    for s, t in zip(s_layers, (t_layers[0], t_layers[2])):
        for (name, a), (_, b) in zip(s.state_dict().items(), t.state_dict().items()):
            assert torch.equal(a, b), name
    torch.testing.assert_close(student.cls.predictions.bias, teacher.cls.predictions.bias)
    # With the teacher's segment-0 embedding zeroed, the student is exactly the teacher cut to layers 0 and 2.
    with torch.no_grad():
        teacher.bert.embeddings.token_type_embeddings.weight[0].zero_()
    ids = torch.randint(1, 80, (2, 10))
    with torch.no_grad():
        x = teacher.bert.embeddings(ids)
        for layer in (t_layers[0], t_layers[2]):
            x, _ = layer(x, None, eager=False)
        torch.testing.assert_close(student(ids), teacher.cls.predictions(x), atol=1e-5, rtol=0)
    student.save_pretrained(tmp_path)
    ref, info = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(ref.eval()(ids).logits, student(ids), atol=1e-5, rtol=0)


def test_student_layer_choice_and_errors():
    teacher = PreTrainingModel(TEACHER)
    student = student_from_teacher(teacher.bert, layers=[1, 3])
    assert torch.equal(student.bert.encoder.layer[1].output.dense.weight,
                       teacher.bert.encoder.layer[3].output.dense.weight)
    with pytest.raises(BertforgeError, match="within"):
        student_from_teacher(teacher, layers=[7])
    with pytest.raises(BertforgeError, match="needs a bert teacher, not roberta"):
        student_from_teacher(PreTrainingModel(TEACHER.replace(model_type="roberta", pad_token_id=1), False))
    with pytest.raises(BertforgeError, match="unshared"):
        student_from_teacher(PreTrainingModel(TEACHER.replace(share_layers="all")))
