//! Every kind of error in torch.fx text is reported at its exact line and column, says what was
//! expected, and carries a hint.

use shardproof_import::parse_fx;
use shardproof_ir::{SourceError, Span};
use std::path::Path;

const HEAD: &str = "class G(torch.nn.Module):\n    def forward(self, x: \"f32[2]\"):\n";

/// Parses `HEAD + body` and returns the error.
fn err(body: &str) -> SourceError {
    let text = format!("{HEAD}{body}");
    match parse_fx(&text, Path::new("bad.py")) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => {
            assert_eq!(e.file, Path::new("bad.py"));
            assert!(
                e.hint.as_deref().is_some_and(|h| !h.is_empty()),
                "no hint: {e}"
            );
            e
        }
    }
}

/// The span of the first occurrence of `needle` in body line `body_line` (1-based within the
/// body; the header has two lines).
fn at(body: &str, body_line: usize, needle: &str) -> Span {
    let line = body.lines().nth(body_line - 1).unwrap();
    let col = line
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in `{line}`"));
    Span::new(body_line + 2, line[..col].chars().count() + 1)
}

fn check(body: &str, body_line: usize, needle: &str, message_part: &str) -> SourceError {
    let e = err(body);
    assert_eq!(e.span, Some(at(body, body_line, needle)), "{e}");
    assert!(
        e.message.contains(message_part),
        "message `{}` lacks `{message_part}`",
        e.message
    );
    e
}

#[test]
fn unknown_name_as_argument() {
    let body = "        a: \"f32[2]\" = torch.ops.aten.mul.Tensor(x, y)\n        return (a,)\n";
    let e = check(body, 1, "y)", "unknown name `y`");
    assert!(e.message.contains("expected"));
}

#[test]
fn malformed_line_missing_colon() {
    let body = "        a \"f32[2]\" = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    check(body, 1, "\"f32", "expected `:`");
}

#[test]
fn malformed_line_double_equals() {
    let body = "        a = = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    check(body, 1, "= torch", "expected a single `=`");
}

#[test]
fn statement_without_assignment() {
    let body = "        torch.ops.aten.neg.default(x)\n        return (x,)\n";
    check(body, 1, "torch", "expected an assignment");
}

#[test]
fn unterminated_bracket() {
    let body = "        a = torch.ops.aten.neg.default(x\n        return (a,)\n";
    let e = check(body, 1, "(x", "unterminated `(`");
    assert!(e.message.contains("expected a matching `)`"));
}

#[test]
fn unterminated_bracket_at_end_of_file() {
    let body = "        a = torch.ops.aten.cat.default([x, x], 0\n";
    check(body, 1, "([x", "unterminated `(`");
}

#[test]
fn mismatched_bracket() {
    let body = "        a = torch.ops.aten.cat.default([x, x), 0)\n        return (a,)\n";
    let e = check(body, 1, "), 0", "expected the `[` opened at 3:");
    assert!(e.message.contains("found `)`"));
}

#[test]
fn truncated_file_without_return() {
    let text = format!("{HEAD}        a = torch.ops.aten.neg.default(x)\n        b = torch.ops.aten.neg.default(a)");
    let e = parse_fx(&text, Path::new("t.py")).unwrap_err();
    assert_eq!(e.span, Some(Span::new(4, 42)), "{e}");
    assert!(e.message.contains("expected a `return`"), "{e}");
    assert!(e.hint.unwrap().contains("truncated"));
}

#[test]
fn body_ends_without_return_before_dedent() {
    let text = format!(
        "{HEAD}        a = torch.ops.aten.neg.default(x)\n    class Sub(torch.nn.Module):\n"
    );
    let e = parse_fx(&text, Path::new("t.py")).unwrap_err();
    assert_eq!(e.span, Some(Span::new(4, 5)), "{e}");
    assert!(e.message.contains("expected a `return`"));
}

#[test]
fn empty_file_has_no_graph() {
    let e = parse_fx("import torch\n\n", Path::new("e.py")).unwrap_err();
    assert_eq!(e.span, Some(Span::new(2, 1)));
    assert!(e.message.contains("expected a `def forward"));
    assert!(e.hint.is_some());
}

#[test]
fn unterminated_string() {
    let body = "        a = torch.ops.tg.log.default(x, 'abc)\n        return (a,)\n";
    check(body, 1, "'abc", "unterminated string");
}

#[test]
fn unknown_dtype_in_annotation() {
    let body = "        a: \"c64[2]\" = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    let e = check(body, 1, "c64", "unknown element type `c64`");
    assert!(e.hint.unwrap().contains("f32"));
}

#[test]
fn malformed_shape_in_annotation() {
    let body = "        a: \"f32[2, ]\" = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    check(body, 1, " ]", "expected a dimension");
}

#[test]
fn value_used_after_release() {
    let body = "        a = torch.ops.aten.neg.default(x);  x = None\n        b = torch.ops.aten.add.Tensor(a, x)\n        return (b,)\n";
    check(body, 2, "x)", "released by `x = None` on line 3");
}

#[test]
fn malformed_location_comment() {
    let body = "        # File: somewhere without a line\n        a = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    check(body, 1, "File:", "expected a source location");
}

#[test]
fn unknown_callable() {
    let body = "        a = torh.ops.aten.neg.default(x)\n        return (a,)\n";
    check(
        body,
        1,
        "torh",
        "unknown callable `torh.ops.aten.neg.default`",
    );
}

#[test]
fn unknown_torch_constant() {
    let body = "        a = torch.ops.aten.to.dtype(x, torch.complex64)\n        return (a,)\n";
    check(body, 1, "torch.complex64", "unknown torch constant");
}

#[test]
fn integer_out_of_range() {
    let body =
        "        a = torch.ops.aten.add.Scalar(x, 99999999999999999999)\n        return (a,)\n";
    check(body, 1, "9999", "out of range");
}

#[test]
fn duplicate_definition() {
    let body = "        a = torch.ops.aten.neg.default(x)\n        a = torch.ops.aten.neg.default(x)\n        return (a,)\n";
    check(body, 2, "a =", "`a` is already defined on line 3");
}

#[test]
fn code_after_return() {
    let body = "        return (x,)\n        a = torch.ops.aten.neg.default(x)\n";
    check(
        body,
        2,
        "a =",
        "expected the end of `forward` after `return`",
    );
}

#[test]
fn inconsistent_body_indentation() {
    let body = "        a = torch.ops.aten.neg.default(x)\n          b = torch.ops.aten.neg.default(a)\n        return (b,)\n";
    let e = err(body);
    assert_eq!(e.span, Some(Span::new(4, 1)));
    assert!(e
        .message
        .contains("expected the body of `forward` to be indented by 8"));
}

#[test]
fn tuple_node_used_whole_after_getitem() {
    let body = "        s = torch.ops.aten.split.Tensor(x, 1)\n        g = s[0]\n        b = torch.ops.aten.cat.default(s)\n        return (b,)\n";
    check(body, 3, "s)", "`s` has several outputs");
}

#[test]
fn returned_literal() {
    let body = "        return (x, 2)\n";
    check(body, 1, "2)", "expected the name of a value or `None`");
}

#[test]
fn unexpected_character() {
    let body = "        a = torch.ops.aten.neg.default(x) $\n        return (a,)\n";
    check(body, 1, "$", "unexpected character `$`");
}

#[test]
fn top_level_garbage() {
    let e = parse_fx("x = 1\n", Path::new("g.py")).unwrap_err();
    assert_eq!(e.span, Some(Span::new(1, 1)));
    assert!(e.message.contains("expected `class ...:`"));
}

#[test]
fn display_names_file_line_and_column() {
    let body = "        a = torch.ops.aten.mul.Tensor(x, y)\n        return (a,)\n";
    let shown = err(body).to_string();
    assert!(
        shown.starts_with("bad.py:3:42: unknown name `y`"),
        "{shown}"
    );
    assert!(shown.contains("\n  hint: "));
}

#[test]
fn annotated_parameters_flattened_later_are_containers() {
    let text = "class G(torch.nn.Module):\n    def forward(self, a: \"f32[2]\", b: \"f32[2]\", primals):\n        x, = fx_pytree.tree_flatten_spec([a, b, primals], self._in_spec)\n        y = torch.ops.aten.add.Tensor(b, x)\n        return (y,)\n";
    let e = parse_fx(text, Path::new("c.py")).unwrap_err();
    assert_eq!(e.span, Some(Span::new(4, 39)), "{e}");
    assert!(e.message.contains("`b` is a pytree container"));
}
