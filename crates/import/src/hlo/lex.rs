//! Tokens of HLO text, one physical line at a time (XLA prints every instruction on one line).

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// A word: a name (`%dot.3`, the `%` dropped), a keyword, an opcode (`all-reduce`), a
    /// number (`16`, `-inf`, `1e-05`) or any other run of name characters.
    Word(String),
    /// A string literal (double- or single-quoted), escapes resolved.
    Str(String),
    /// Punctuation: one of `= , ( ) { } [ ] : < > * -> <=`.
    Punct(&'static str),
}

/// A token and its 1-based column (its line is the line being lexed).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub col: usize,
}

impl Token {
    pub(crate) fn is_punct(&self, p: &str) -> bool {
        matches!(&self.tok, Tok::Punct(q) if *q == p)
    }

    pub(crate) fn word(&self) -> Option<&str> {
        match &self.tok {
            Tok::Word(w) => Some(w),
            _ => None,
        }
    }

    /// A short description for "found ..." in error messages.
    pub(crate) fn describe(&self) -> String {
        match &self.tok {
            Tok::Word(w) => format!("`{}`", crate::excerpt(w)),
            Tok::Str(_) => "a string".to_string(),
            Tok::Punct(p) => format!("`{p}`"),
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '%' | '#')
}

/// The tokens of one line, skipping `/* ... */` comments (XLA prints `/*index=5*/` inside long
/// lists) and a trailing `// ...` comment. Errors give the 1-based column and a message.
pub(crate) fn lex_line(line: &str) -> Result<Vec<Token>, (usize, String)> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'*') {
            let mut j = i + 2;
            while j + 1 < chars.len() && !(chars[j] == '*' && chars[j + 1] == '/') {
                j += 1;
            }
            if j + 1 >= chars.len() {
                return Err((col, "a `/*` comment is not closed on its line".into()));
            }
            i = j + 2;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            break;
        }
        if c == '"' || c == '\'' {
            let mut s = String::new();
            let mut j = i + 1;
            loop {
                match chars.get(j) {
                    None => return Err((col, "a string is not closed on its line".into())),
                    Some(&q) if q == c => break,
                    Some('\\') => {
                        let e = chars.get(j + 1).copied().unwrap_or('\\');
                        s.push(match e {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        });
                        j += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        j += 1;
                    }
                }
            }
            out.push(Token {
                tok: Tok::Str(s),
                col,
            });
            i = j + 1;
            continue;
        }
        if c == '-' && chars.get(i + 1) == Some(&'>') {
            out.push(Token {
                tok: Tok::Punct("->"),
                col,
            });
            i += 2;
            continue;
        }
        if c == '<' && chars.get(i + 1) == Some(&'=') {
            out.push(Token {
                tok: Tok::Punct("<="),
                col,
            });
            i += 2;
            continue;
        }
        let punct = match c {
            '=' => Some("="),
            ',' => Some(","),
            '(' => Some("("),
            ')' => Some(")"),
            '{' => Some("{"),
            '}' => Some("}"),
            '[' => Some("["),
            ']' => Some("]"),
            ':' => Some(":"),
            '<' => Some("<"),
            '>' => Some(">"),
            '*' => Some("*"),
            '?' => Some("?"),
            '@' => Some("@"),
            '|' => Some("|"),
            '/' => Some("/"),
            _ => None,
        };
        if let Some(p) = punct {
            out.push(Token {
                tok: Tok::Punct(p),
                col,
            });
            i += 1;
            continue;
        }
        if is_word_char(c) || c == '-' || c == '+' {
            let mut j = i;
            let mut w = String::new();
            while j < chars.len() {
                let ch = chars[j];
                let sign_ok = (ch == '-' || ch == '+')
                    && chars.get(j + 1).is_some_and(|&n| is_word_char(n))
                    && (j == i || ch == '-' || matches!(chars[j - 1], 'e' | 'E'));
                if is_word_char(ch) || sign_ok {
                    w.push(ch);
                    j += 1;
                } else {
                    break;
                }
            }
            if w.is_empty() {
                return Err((col, format!("unexpected character `{c}`")));
            }
            let w = w.strip_prefix('%').map(str::to_string).unwrap_or(w);
            out.push(Token {
                tok: Tok::Word(w),
                col,
            });
            i = j;
            continue;
        }
        return Err((col, format!("unexpected character `{c}`")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        lex_line(line)
            .unwrap()
            .into_iter()
            .map(|t| match t.tok {
                Tok::Word(w) => w,
                Tok::Str(s) => format!("\"{s}\""),
                Tok::Punct(p) => p.to_string(),
            })
            .collect()
    }

    #[test]
    fn instruction_lines_lex() {
        assert_eq!(
            words("ROOT %all-reduce = f32[8]{0} all-reduce(%x.1), to_apply=%add.clone"),
            [
                "ROOT",
                "all-reduce",
                "=",
                "f32",
                "[",
                "8",
                "]",
                "{",
                "0",
                "}",
                "all-reduce",
                "(",
                "x.1",
                ")",
                ",",
                "to_apply",
                "=",
                "add.clone"
            ]
        );
        assert_eq!(
            words("c = f32[] constant(-inf), /*index=5*/ x=1e-05 // tail"),
            ["c", "=", "f32", "[", "]", "constant", "(", "-inf", ")", ",", "x", "=", "1e-05"]
        );
        assert_eq!(
            words("(a: f32[]) -> f32[]"),
            ["(", "a", ":", "f32", "[", "]", ")", "->", "f32", "[", "]"]
        );
        assert_eq!(
            words("mesh['axis_0'=1]"),
            ["mesh", "[", "\"axis_0\"", "=", "1", "]"]
        );
        assert_eq!(
            words("[2,2]<=[4]"),
            ["[", "2", ",", "2", "]", "<=", "[", "4", "]"]
        );
    }

    #[test]
    fn unclosed_things_are_errors() {
        assert_eq!(lex_line("a \"b").unwrap_err().0, 3);
        assert_eq!(lex_line("x /* y").unwrap_err().0, 3);
        assert_eq!(lex_line("x ^").unwrap_err().0, 3);
    }
}
