"""The annotation file: the paper's flat layout, the structured layout, matching, and errors
that name file:line:col."""

import pytest

from shardproof.trace import AnnotationError, TensorSplit, load_annotations, parse_annotations

FIGURE_3 = """\
# parameter annotations
word_embeddings.weight:
  tp_dim: 0

linear_qkv.weight:
  tp_dim: 0

linear_proj.weight:
  tp_dim: 1
# module annotations
linear_qkv:
  input:
    sp_dim: 0
    cp_dim: 0

  output:
    tp_dim: -1
    cp_dim: 0
"""


def test_figure_3_layout_parses_parameters_and_modules():
    ann = parse_annotations(FIGURE_3, "fig3.yaml")
    assert ann.param("embedding.word_embeddings.weight").tp_dim == 0
    assert ann.param("layers.3.self_attention.linear_proj.weight").tp_dim == 1
    module = ann.module("layers.3.self_attention.linear_qkv")
    assert module.input_split(0) == TensorSplit(sp_dim=0, cp_dim=0)
    assert module.input_split(5) == TensorSplit(sp_dim=0, cp_dim=0)  # one split for every input
    assert module.output_split(0) == TensorSplit(tp_dim=-1, cp_dim=0)
    assert ann.module("layers.3.self_attention.linear_proj") is None  # not annotated: not traced
    assert ann.module("layers.3.self_attention.xlinear_qkv") is None  # suffix matches whole segments


def test_structured_layout_lists_and_globs():
    ann = parse_annotations("""
parameters:
  "*layernorm.weight": {partial_grad: [sp, pp]}
modules:
  "layers.*":
    input: [{sp_dim: 0}, {}]
    ep: false
  mlp: {output: {}}
""")
    assert ann.param("layers.0.input_layernorm.weight").partial_grad == ("sp", "pp")
    layer = ann.module("layers.7")
    assert layer.input_split(0) == TensorSplit(sp_dim=0)
    assert layer.input_split(1) == TensorSplit()
    assert layer.input_split(2) is None
    assert ann.module("layers.7.mlp").output_split(0) == TensorSplit()  # `*` stays in one segment
    assert ann.module("layers.7.mlp").input is None


def test_longest_matching_key_wins():
    ann = parse_annotations("""
linear.weight: {tp_dim: 0}
fc2.linear.weight: {tp_dim: 1}
""")
    assert ann.param("mlp.fc2.linear.weight").tp_dim == 1
    assert ann.param("mlp.fc1.linear.weight").tp_dim == 0


def test_empty_file_and_file_loading(tmp_path):
    assert parse_annotations("").modules == {}
    path = tmp_path / "a.yaml"
    path.write_text(FIGURE_3)
    assert load_annotations(str(path)).source == str(path)


@pytest.mark.parametrize("text, where, what", [
    ("a:\n  input: {sp_dim: x}\n", "bad.yaml:2:19", "expected an integer dimension for a.input.sp_dim"),
    ("a:\n  input: {sq_dim: 0}\n", "bad.yaml:2:10", "unknown key `sq_dim`"),
    ("a.weight:\n  tp_dim: 0\n  colour: red\n", "bad.yaml:3:11", "unknown key `colour` in parameter `a.weight`"),
    ("a.weight: {partial_grad: [xp]}\n", "bad.yaml:1:27", "expected one of sp, pp, cp, tp"),
    ("a: {input: {}}\na: {output: {}}\n", "bad.yaml:2:1", "duplicate key `a`"),
    ("- a\n- b\n", "bad.yaml:1:1", "expected a mapping for the annotation file, found a list"),
    ("a:\n  input: [\n", "bad.yaml:3:1", "not valid YAML"),
    ("a: {ep: maybe}\n", "bad.yaml:1:9", "expected true or false"),
    ("modules:\n  m:\n    input: 3\n", "bad.yaml:3:12", "expected a mapping for m.input"),
])
def test_bad_files_name_file_line_column_and_expectation(text, where, what):
    with pytest.raises(AnnotationError) as err:
        parse_annotations(text, "bad.yaml")
    message = str(err.value)
    assert message.startswith(where + ": "), message
    assert what in message, message
    assert "hint:" in message


def test_exact_replicas_is_a_boolean_of_modules_and_parameters():
    ann = parse_annotations("""
input_amax: {output: {}, exact_replicas: true}
linear_fc1.weight: {tp_dim: 0, exact_replicas: true}
linear_fc2: {output: {}}
""", "exact.yaml")
    assert ann.module("layers.0.mlp.linear_fc1.input_amax").exact_replicas
    assert ann.param("layers.0.mlp.linear_fc1.weight").exact_replicas
    assert not ann.module("layers.0.mlp.linear_fc2").exact_replicas
    with pytest.raises(AnnotationError, match=r"exact.yaml:1:42: expected true or false for input_amax.exact_replicas"):
        parse_annotations("input_amax: {output: {}, exact_replicas: 1}", "exact.yaml")
