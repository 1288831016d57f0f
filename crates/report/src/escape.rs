//! Escaping of text that comes from user files (node names, messages) into XML and HTML.
//!
//! Written by hand rather than through an XML library: the documents are small and written
//! once, front to back, and the one thing a library would add, escaping, is these few lines.

/// `text` escaped for XML or HTML, in element content and in quoted attribute values alike:
/// `& < > " '` as entities, and the characters XML 1.0 forbids even as references (controls
/// other than tab, newline and carriage return; unpaired surrogates cannot occur in a `str`;
/// U+FFFE, U+FFFF) replaced by U+FFFD, so the document stays well-formed whatever a file holds.
pub(crate) fn markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if allowed_in_xml(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

/// `text` escaped for HTML content, with each `` `quoted` `` span set as code, as the engines'
/// messages quote names. Unbalanced backticks stay as they are.
pub(crate) fn prose(text: &str) -> String {
    let escaped = markup(text);
    let parts: Vec<&str> = escaped.split('`').collect();
    if parts.len().is_multiple_of(2) {
        return escaped;
    }
    let mut out = String::with_capacity(escaped.len() + 16);
    for (k, part) in parts.iter().enumerate() {
        if k % 2 == 1 {
            out.push_str("<code>");
            out.push_str(part);
            out.push_str("</code>");
        } else {
            out.push_str(part);
        }
    }
    out
}

/// `text` escaped for a quoted attribute value, with tab, newline and carriage return as
/// character references: a parser turns them, written raw, into spaces.
pub(crate) fn attribute(text: &str) -> String {
    markup(text)
        .replace('\t', "&#9;")
        .replace('\n', "&#10;")
        .replace('\r', "&#13;")
}

fn allowed_in_xml(c: char) -> bool {
    !(c < '\u{20}' || ('\u{7F}'..='\u{9F}').contains(&c) || c == '\u{FFFE}' || c == '\u{FFFF}')
}

/// `text` cut to at most `max` characters, an ellipsis marking the cut (boxes in the drawing
/// have a fixed width; the full text is in the box's tooltip and in the tables).
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_markup_character() {
        assert_eq!(
            markup(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn replaces_what_xml_forbids() {
        assert_eq!(
            markup("a\u{0}b\u{1b}c\td\u{FFFF}"),
            "a\u{FFFD}b\u{FFFD}c\td\u{FFFD}"
        );
        assert_eq!(markup("mm_1 ∑ é"), "mm_1 ∑ é");
    }

    #[test]
    fn quoted_names_become_code_and_stay_escaped() {
        assert_eq!(
            prose("output `a<b` differs"),
            "output <code>a&lt;b</code> differs"
        );
        assert_eq!(prose("one ` only"), "one ` only");
    }

    #[test]
    fn attributes_keep_their_line_breaks() {
        assert_eq!(attribute("a\nb\t<"), "a&#10;b&#9;&lt;");
    }

    #[test]
    fn shortens_by_characters_not_bytes() {
        assert_eq!(shorten("ééééé", 3), "éé…");
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abc", 0), "…");
    }
}
